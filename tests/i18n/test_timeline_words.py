"""The session page's run states, checkpoint boundaries and resume line, and the reviewer pages' verdict
channel, in the page's language (docs/pages.md#language): a Simplified Chinese page says an ended run's
state ("已中断", not "interrupted"), a checkpoint's boundary ("等待外部结果", not "external wait") on the
timeline, the checkpoints panel and the event feed, a resume as a sentence (not ``generation=2 · …``),
and where a verdict came from in words (not "relay"); the codes stay in attributes. The live pages'
script says the same from the same maps (tests/browser/test_languages.py)."""
from __future__ import annotations

import json
import re

import pytest
from django.utils import translation

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.dashboard import presenters
from reviews.models import Verdict
from reviews.templatetags.review_panels import CHANNEL_LABELS
from tests.dashboard.conftest import csrf_token, logged_in, make_user
from tests.dashboard.conftest import make_session  # noqa: F401 (the manager pages' fixture)
from tests.dashboard.test_handoffs import handoff
from tests.i18n.test_refusal_pages import chinese, shown
from tests.reviews.conftest import as_user, world  # noqa: F401 (the review world's fixtures)
from tests.reviews.factories import verdict_for
from tests.reviews.test_pages import form_post
from tests.support.factories import caller_for

pytestmark = pytest.mark.django_db

#: A resume's event as the service writes it (control/resume.py): one handoff and one review gate carried over.
RESUMED = {"run_id": 7, "generation": 2, "checkpoint_id": 5, "reason": "resumed by manager", "pending_external": [],
           "carried_over": {"gates": [{"gate_id": 3}], "handoffs": [{"handoff_id": 1, "logical_id": "c2/check"}]}}


def test_every_boundary_has_words_and_they_are_translated():
    assert set(presenters.BOUNDARY_WORDS) == set(rt.CheckpointBoundary)
    assert presenters.boundary_words("external_wait") == "external wait"
    assert presenters.boundary_words("some_new_place") == "some new place"  # unknown: the code, spaced
    with translation.override("zh-hans"):
        said = [presenters.boundary_words(b) for b in rt.CheckpointBoundary]
        assert all(re.search(r"[\u4e00-\u9fff]", w) for w in said), said
        assert presenters.words()["boundaries"]["external_wait"] == presenters.boundary_words("external_wait")
        assert presenters.words()["codes"]["interrupted"] == "已中断"


def test_every_verdict_channel_has_words_and_they_are_translated():
    assert set(CHANNEL_LABELS) == set(Verdict.Channel)
    with translation.override("zh-hans"):
        assert all(re.search(r"[\u4e00-\u9fff]", str(CHANNEL_LABELS[c])) for c in Verdict.Channel)


def test_the_summaries_say_run_states_boundaries_and_a_resume_in_words():
    assert presenters.describe("run.ended", {"seq": 1, "state": "interrupted"}) == "run #1 interrupted"
    assert presenters.describe("checkpoint.recorded", {"seq": 2, "boundary": "user_wait"}) == "checkpoint #2 · user wait"
    assert presenters.describe("session.resumed", RESUMED) == (
        "resumed on generation 2 · 1 unfinished handoff carried over · 1 open review gate carried over · resumed by manager")
    assert presenters.describe("session.resumed", {"generation": 3, "checkpoint_id": None, "carried_over": {
        "handoffs": [{}, {}], "other": [{}]}}) == (
        "resumed on generation 3 · no checkpoint: starts from the beginning · 2 unfinished handoffs carried over"
        " · 1 other wait carried over")
    with translation.override("zh-hans"):
        assert presenters.describe("run.ended", {"seq": 1, "state": "interrupted", "reason": "closed by manager"}) \
            == "运行 #1：已中断 · 由管理者关闭"
        assert presenters.describe("checkpoint.recorded", {"seq": 2, "boundary": "external_wait"}) == "检查点 #2 · 等待外部结果"
        resumed = presenters.describe("session.resumed", RESUMED)
        assert resumed == ("已恢复，现为第 2 代 · 1 个未完成的交接任务已转入新运行 · 1 个未结束的审阅关卡已转入新运行"
                           " · 由管理者恢复")
        assert not re.search(r"[A-Za-z]", resumed)


def resumed_session(make_session, boss):
    """A session whose run waits on a handoff from an ``external_wait`` checkpoint, its runtime closed by
    the manager and the session resumed from the page: the waiting run ends interrupted (superseded by the
    resume) and the handoff is carried over to the new run."""
    session = make_session(run=True)
    handoff(session, "chapter-2/check")
    record_checkpoint(caller_for(session.project), session.runs.get().id, {
        "boundary": "external_wait", "cursor": {"step": "wait"}, "pending": {"handoffs": ["chapter-2/check"]}})
    token = csrf_token(boss, f"/sessions/{session.id}/")
    assert boss.post(f"/sessions/{session.id}/close/", {"csrfmiddlewaretoken": token}).status_code == 302
    assert boss.post(f"/sessions/{session.id}/resume/", {"csrfmiddlewaretoken": token}).status_code == 302
    assert session.runs.filter(state=rt.RunState.INTERRUPTED).count() == 1
    return session


def test_the_session_page_says_run_states_boundaries_and_the_resume_in_chinese(project, make_session):
    boss = chinese(logged_in(make_user("boss", project), csrf=True))
    session = resumed_session(make_session, boss)
    page = boss.get(f"/sessions/{session.id}/")
    html, text = page.content.decode(), shown(page)
    assert "运行 #1：已中断 · 已被恢复操作取代" in text  # the feed's run.ended
    assert "检查点 #1 · 等待外部结果" in text  # the feed's checkpoint.recorded
    assert "已恢复，现为第 2 代 · 1 个未完成的交接任务已转入新运行 · 由管理者恢复" in text  # session.resumed
    assert re.search(r'<span class="tl-tick-label[^"]*">等待外部结果</span>', html)  # the timeline's tick
    assert 'title="external_wait" data-boundary="external_wait">等待外部结果</span>' in html  # the checkpoints panel
    assert 'title="closed">已关闭</span>' in html  # the first runtime
    for english in ("interrupted", "external wait", "external_wait", "generation=", "carried_over", "resumed on",
                    "carried over", ">closed<"):
        assert english not in text, english


def test_the_session_page_in_english_says_the_same_in_english(project, make_session):
    boss = logged_in(make_user("boss", project), csrf=True)
    session = resumed_session(make_session, boss)
    page = boss.get(f"/sessions/{session.id}/")
    html, text = page.content.decode(), shown(page)
    assert "run #1 interrupted · superseded by resume" in text and "checkpoint #1 · external wait" in text
    assert "resumed on generation 2 · 1 unfinished handoff carried over · resumed by manager" in text
    assert re.search(r'<span class="tl-tick-label[^"]*">external wait</span>', html)
    assert "generation=" not in text and "external_wait" not in text


def test_the_reviewer_confirmation_says_the_channel_in_words_in_chinese(world, as_user):
    gate = world.gate(route="relay")
    alice = chinese(as_user("alice"))
    resp = alice.post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": "```json\n" + json.dumps(verdict_for(gate)) + "\n```"})
    assert resp.status_code == 302 and Verdict.objects.get().channel == "relay"
    page = alice.get(resp["Location"])
    text = shown(page)
    assert "已通过另一个对话的回复绑定到" in text and "通过 relay" not in text and "通过relay" not in text
    assert 'data-channel="relay"' in page.content.decode()


def test_the_managers_review_panel_says_the_channel_in_words_in_chinese(world, as_user):
    gate = world.gate(route="page")
    alice = as_user("alice")
    assert alice.post(f"/reviews/packets/{gate.packet.id}/", form_post(gate)).status_code == 302
    mia = chinese(as_user("mia"))
    page = mia.get(f"/sessions/{world.writer.id}/")
    text = shown(page)
    assert "通过审阅页面" in text and "via page" not in text and "通过 page" not in text
    assert 'data-channel="page"' in page.content.decode()
    english = shown(as_user("mia").get(f"/sessions/{world.writer.id}/"))
    assert "via the reviewer page" in english
