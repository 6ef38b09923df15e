"""Refusals and checks on the pages in Simplified Chinese (docs/pages.md#language): the reviewer's
verdict form, the relay box, the manager's actions, the webhook form and the resume report say what
was refused or checked in Chinese — the validators' messages, the relay's reasons, every catalogued
code's words, the resume steps' details and repair routes — and not the API's English; the codes
stay as they are. The language is chosen with the switcher's cookie; every refusal writes nothing.
The API keeps its English messages whatever the request's language."""
from __future__ import annotations

import html as htmllib
import json
import re

import pytest
from django.conf import settings
from django.test import Client

from novelforge_sessions.control.models import Handoff
from novelforge_sessions.errors import ConflictingResult
from novelforge_sessions.models import Project
from novelforge_sessions.webhooks.models import WebhookEndpoint
from reviews.models import Verdict
from tests.dashboard.conftest import csrf_token, logged_in, make_user
from tests.dashboard.conftest import make_session, manager, mgr_client  # noqa: F401 (the manager pages' fixtures)
from tests.dashboard.test_actions import failed_after_runtime_lost
from tests.dashboard.test_handoffs import claim, deliver, handoff
from tests.reviews.conftest import as_user, world  # noqa: F401 (the review world's fixtures)
from tests.reviews.factories import verdict_for
from tests.reviews.test_pages import form_post
from tests.support.factories import Api
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

COOKIE = settings.LANGUAGE_COOKIE_NAME


def chinese(client: Client) -> Client:
    client.cookies[COOKIE] = "zh-hans"
    return client


def shown(response) -> str:
    """What a person reads on the page: its text without markup, scripts or styles."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", response.content.decode(), flags=re.S)
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", page)))


def refusal(response) -> str:
    """The refusal box of a reviewer page (its plain lines and its technical details)."""
    match = re.search(r'<div class="refusal".*?</details>\s*</div>', response.content.decode(), re.S)
    assert match, "the page shows a refusal"
    return re.sub(r"\s+", " ", htmllib.unescape(re.sub(r"<[^>]+>", " ", match.group(0))))


# --- the reviewer's pages ----------------------------------------------------------------------------------
def test_the_verdict_form_refusal_is_in_chinese_and_binds_nothing(world, as_user):
    gate = world.gate()
    before = snapshot()
    resp = chinese(as_user("alice")).post(f"/reviews/packets/{gate.packet.id}/", form_post(
        gate, **{"score-clarity": "9", "finding-0-location": "L99", "finding-1-location": "L3-1",
                 "finding-1-severity": "minor", "finding-1-note": "Backwards?"}))
    assert resp.status_code == 422
    box = refusal(resp)
    for said in ("你的审阅还没有提交。", "问题 1：第 99 行不在待审文本中（待审文本共 4 行）。", "问题 2：范围 3-1 的起止顺序颠倒了。",
                 "scores.clarity：9 超出了评分范围 1..5", "findings[0].location 第 99 行不在待审文本中"):
        assert said in box, box
    for english in ("is not in the candidate", "Line 99", "runs backwards", "outside the scale", "Finding"):
        assert english not in box, box
    assert '<code class="field-name">scores.clarity</code>' in resp.content.decode()  # the field names stay
    before.assert_unchanged()


@pytest.mark.parametrize(("answer", "chinese_text", "english_text"), [
    ("Here is my review, no JSON though.", "回复中没有找到 JSON 对象。", "No JSON object was found"),
    ('{"decision": "pass",}', "回复中的 JSON 对象不是有效的 JSON（第 1 行第 21 列：此处应有用双引号括起来的属性名）。",
     "not valid JSON"),
    ('{"a": 1}\n{"b": 2}', "回复中有 2 个 JSON 对象（分别从第 1, 2 行开始）；但只能有一个。", "exactly one"),
    ("[1, 2]", "回复是一个列表，而不是 JSON 对象。", "is a list"),
])
def test_the_relay_refusals_are_in_chinese_and_bind_nothing(world, as_user, answer, chinese_text, english_text):
    gate = world.gate(route="relay")
    before = snapshot()
    resp = chinese(as_user("alice")).post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": answer})
    assert resp.status_code == 400
    box = refusal(resp)
    assert "这个回复未被接受。" in box and chinese_text in box, box
    assert english_text not in box and "answer" in box, box  # the field's name stays
    before.assert_unchanged()


def test_the_relay_says_what_it_read_from_the_answer_in_the_pages_language(world, as_user):
    gate = world.gate(route="relay")
    answer = json.dumps(verdict_for(gate, findings=[{"location": "L9", "severity": "minor", "note": "x"}]))
    before = snapshot()
    zh = chinese(as_user("alice")).post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": answer})
    assert zh.status_code == 422
    box = refusal(zh)
    assert "已检查从整个回复（第 1 行）中读取的一个 JSON 对象。" in box
    assert "问题 1：第 9 行不在待审文本中（待审文本共 4 行）。" in box
    assert "one JSON object from" not in box and "whole answer" not in box and "is not in the candidate" not in box
    en = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": answer})
    box = refusal(en)
    assert "Checked one JSON object from the whole answer (line 1)." in box
    assert "Finding 1: Line 9 is not in the candidate (it has 4 lines)." in box
    before.assert_unchanged()


def test_the_confirmation_says_where_the_relay_found_the_answer_in_chinese(world, as_user):
    gate = world.gate(route="relay")
    alice = chinese(as_user("alice"))
    answer = "Here it is:\n```json\n" + json.dumps(verdict_for(gate)) + "\n```\nCheers."
    resp = alice.post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": answer})
    assert resp.status_code == 302 and Verdict.objects.count() == 1
    text = shown(alice.get(resp["Location"]))
    assert "已从粘贴回复的```json 代码块（第 3 行）中读取了一个 JSON 对象。" in text
    assert "Read one JSON object" not in text and "(第" not in text


def test_a_refusal_without_a_plain_sentence_of_the_page_says_its_codes_words(world, as_user):
    """The gate's session ended: the refusal (``gate_closed``) is the code's words, not the API's message."""
    gate = world.gate(route="relay")
    answer = json.dumps(verdict_for(gate))
    world.writer_api.post(f"/review-gates/{gate.id}/cancel")
    before = snapshot()
    resp = chinese(as_user("alice")).post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": answer})
    assert resp.status_code == 409
    box = refusal(resp)
    assert "gate_closed" in box and "这次审阅已关闭：已被撤回或已经完成。" in box, box
    assert "cancelled" not in box and "review gate" not in box, box
    assert Verdict.objects.count() == 0
    before.assert_unchanged()


# --- the manager's pages -----------------------------------------------------------------------------------
@pytest.fixture
def boss(project):
    return chinese(logged_in(make_user("boss", project), csrf=True))


def test_a_manager_action_refused_by_a_validator_says_why_in_chinese(boss, make_session):
    session = make_session(run=True)
    h = claim(handoff(session, "job-conflict"))
    deliver(h, {"verdict": "consistent"})
    with pytest.raises(ConflictingResult):
        deliver(h, {"verdict": "something else"})
    token = csrf_token(boss, f"/sessions/{session.id}/")
    before = snapshot()
    resp = boss.post(f"/sessions/{session.id}/handoffs/{h.id}/resolve-conflict/",
                     {"csrfmiddlewaretoken": token, "resolution": "  "}, follow=True)
    text = shown(resp)
    assert "处理说明必须写明冲突是如何处理的（1–200 个字符） (validation_error)" in text
    assert "resolution must say" not in text
    before.assert_unchanged()
    assert Handoff.objects.get(id=h.id).state == "conflicted"


def test_a_manager_action_refused_with_a_code_the_page_had_no_words_for_says_it_in_chinese(boss, make_session):
    """``not_found`` had no page words: the resume page showed the API's English message."""
    session = failed_after_runtime_lost(make_session)
    token = csrf_token(boss, f"/sessions/{session.id}/")
    before = snapshot()
    resp = boss.post(f"/sessions/{session.id}/resume/", {"csrfmiddlewaretoken": token, "checkpoint_id": "987654"})
    assert resp.status_code == 404
    text = shown(resp)
    assert "已拒绝： 它不存在，或你无权查看。 not_found" in text
    assert "checkpoint not found" not in text
    before.assert_unchanged()


def test_the_webhook_form_refusal_is_in_chinese_and_registers_nothing(boss, project):
    token = csrf_token(boss, f"/projects/{project.id}/webhooks/")
    for url, said, english in [
        ("ftp://93.184.216.34/x", "没有登记任何内容： Webhook URL 必须以 http:// 或 https:// 开头", "a webhook URL is"),
        ("http://user:pw@93.184.216.34/x", "Webhook URL 不能包含登录凭据", "carries no credentials"),
    ]:
        resp = boss.post(f"/projects/{project.id}/webhooks/",
                         {"csrfmiddlewaretoken": token, "url": url, "event_types": ["session.created"]})
        assert resp.status_code == 422
        text = shown(resp)
        assert said in text and english not in text, text
    resp = boss.post(f"/projects/{project.id}/webhooks/", {"csrfmiddlewaretoken": token, "url": "http://93.184.216.34/x"})
    text = shown(resp)
    assert "请至少选择一种事件类型" in text and "name at least one event type" not in text
    assert not WebhookEndpoint.objects.exists()


def test_the_resume_report_is_in_chinese_with_its_codes_kept(boss, make_session):
    session = failed_after_runtime_lost(make_session)
    ok = boss.get(f"/sessions/{session.id}/resume/")
    assert ok.status_code == 200
    text = shown(ok)
    for said in ("载入检查点 检查点 ", "框架 框架 1 未改变", "权威版本 权威版本 v1 和锁定均未改变",
                 "上下文 已按当前状态重建（0 个产出文件）；未读取对话记录", "继续 在新的运行中从保存的游标继续"):
        assert said in text, text
    for english in ("unchanged", "transcript not read", "still current", "continue the saved cursor", "load"):
        assert english not in text, english
    assert 'data-step="load"' in ok.content.decode() and 'data-step="continue"' in ok.content.decode()

    Project.objects.filter(id=session.project_id).update(authority_version=2)
    before = snapshot()
    refused = boss.get(f"/sessions/{session.id}/resume/")
    assert refused.status_code == 409
    text = shown(refused)
    for said in ("自检查点以来，权威版本或锁定已改变 修复方式：重新冻结", "未继续：权威版本 未通过",
                 "恢复已停止：有绑定项发生了实质变化。修复途径： 重新冻结 。"):
        assert said in text, text
    for english in ("re-freeze", "changed since the checkpoint", "not continued", "authority failed"):
        assert english not in text, english
    before.assert_unchanged()


def test_the_resume_report_in_english_is_the_apis_own(mgr_client, make_session):
    session = failed_after_runtime_lost(make_session)
    Project.objects.filter(id=session.project_id).update(authority_version=2)
    html = mgr_client.get(f"/sessions/{session.id}/resume/").content.decode()
    assert "<strong>authority</strong> <span class=\"detail\">authority or lock changed since the checkpoint</span>" in html
    assert "<strong>continue</strong> <span class=\"detail\">not continued: authority failed</span>" in html
    assert "repair: re-freeze" in html and "Repair route: <strong>re-freeze</strong>." in html


# --- the API keeps its English ------------------------------------------------------------------------------
def test_the_api_answers_refusals_and_reports_in_english_whatever_the_language(project, make_session):
    from novelforge_sessions.actions.tokens import create_token

    _, raw = create_token(project, name="ops", permissions=["manage", "read", "write"])
    api = Api(raw)
    api.client = Client(HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9")
    api.client.cookies[COOKIE] = "zh-hans"
    resp = api.post("/webhooks", {"url": "ftp://93.184.216.34/x", "event_types": ["*"]})
    assert resp.status_code == 422
    assert resp.json()["error"] == {"code": "webhook_url_refused", "message": "a webhook URL is http:// or https://",
                                    "details": {"field": "url"}}
    session = failed_after_runtime_lost(make_session)
    report = api.post(f"/sessions/{session.id}/resume",
                      {"runtime": {"runtime_family": session.runtime_family}, "dry_run": True})
    assert report.status_code == 200, report.content
    details = {s["step"]: s["detail"] for s in report.json()["steps"]}
    assert details["framework"] == "framework 1 unchanged" and details["continue"] == "continue the saved cursor in a new run"
    assert not re.search(r"[\u4e00-\u9fff]", report.content.decode() + resp.content.decode())
