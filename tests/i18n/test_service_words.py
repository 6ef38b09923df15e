"""Words the service writes that the manager's pages show (docs/pages.md#language): the reasons it
writes in words (a manager's action, results bound, a resume), where a handoff stands, and the
webhook form's named notices read in Simplified Chinese on a Chinese page, as they are in English on
an English one; the codes stay in attributes."""
from __future__ import annotations

import pytest
from django.utils import translation

from novelforge_sessions.dashboard import presenters
from novelforge_sessions.dashboard.webhooks import KIND_WORDS
from novelforge_sessions.errors import ConflictingResult
from novelforge_sessions.webhooks.endpoints import NAMED_KINDS
from tests.dashboard.conftest import csrf_token, logged_in, make_user
from tests.dashboard.conftest import make_session  # noqa: F401 (the manager pages' fixture)
from tests.dashboard.test_handoffs import claim, deliver, handoff
from tests.i18n.test_refusal_pages import chinese, shown

pytestmark = pytest.mark.django_db

#: The reasons the service writes in words, as the code writes them.
SERVICE_REASONS = ["run started", "graph thread deleted", "external results bound", "superseded by resume",
                   "closed by manager", "abort requested by manager", "terminated by manager", "resumed by manager"]


@pytest.mark.parametrize("reason", SERVICE_REASONS)
def test_every_reason_the_service_writes_in_words_is_translated(reason):
    assert presenters.reason_text(reason) == reason
    with translation.override("zh-hans"):
        said = presenters.reason_text(reason)
        assert said != reason and presenters.words()["reasons"][reason] == said


def test_every_named_notice_of_the_webhook_form_has_words():
    assert set(KIND_WORDS) == set(NAMED_KINDS)
    with translation.override("zh-hans"):
        assert all(str(KIND_WORDS[k]) != k for k in NAMED_KINDS)


def test_the_session_page_says_the_managers_reasons_and_the_handoffs_state_in_chinese(project, make_session):
    boss = chinese(logged_in(make_user("boss", project), csrf=True))
    session = make_session(run=True)
    h = claim(handoff(session, "job-conflict"))
    deliver(h, {"verdict": "consistent"})
    with pytest.raises(ConflictingResult):
        deliver(h, {"verdict": "something else"})
    page = boss.get(f"/sessions/{session.id}/")
    text = shown(page)
    assert "一个结果已被采用后，又收到了一个不同的结果：需要管理者处理" in text and "外部结果已绑定" in text
    for english in ("a manager must resolve it", "external results bound", "conflicted"):
        assert english not in text, english
    assert 'data-state="conflicted"' in page.content.decode()
    busy = make_session(run=True)
    claim(handoff(busy, "job-waiting"))
    page = boss.get(f"/sessions/{busy.id}/")
    assert "有执行程序持有租约" in shown(page) and "holds the lease" not in shown(page)
    assert 'title="claimed">已认领<' in page.content.decode()

    other = make_session(attach=False)
    token = csrf_token(boss, f"/sessions/{other.id}/")
    assert boss.post(f"/sessions/{other.id}/resume/", {"csrfmiddlewaretoken": token}).status_code == 302
    assert boss.post(f"/sessions/{other.id}/close/", {"csrfmiddlewaretoken": token}).status_code == 302
    text = shown(boss.get(f"/sessions/{other.id}/"))
    assert "由管理者关闭" in text and "closed by manager" not in text  # the runtime's end, the run's, the state change's


def test_the_webhook_form_names_its_notices_in_chinese(project):
    boss = chinese(logged_in(make_user("boss", project), csrf=True))
    text = shown(boss.get(f"/projects/{project.id}/webhooks/"))
    assert "审阅已请求 (review.gate_opened)" in text and "交接任务等待过久 (handoff.waiting_long)" in text
    assert "gate opened" not in text and "handoff waiting too long" not in text
