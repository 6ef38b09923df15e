"""Manager pages say states and coded reasons in words (a code alone tells a person nothing).

One map (``presenters.STATE_LABELS`` / ``REASON_TEXT``) for every manager page and, rendered
once into the live pages, for static/js (checked in Chromium by tests/browser/test_dashboard.py).
The code stays reachable: ``data-state``, ``title``, ``data-reason``, the filter's values."""
from __future__ import annotations

import html as htmllib
import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.actions import sessions as session_actions
from novelforge_sessions.actions.runtimes import reconcile_expired_runtimes
from novelforge_sessions.dashboard import presenters
from novelforge_sessions.dashboard.presenters import build_diagram, describe, reason, state_label
from tests.support.factories import caller_for

pytestmark = pytest.mark.django_db

S = rt.SessionStatus
WORDS = {S.AWAITING_USER: "waiting for a person", S.AWAITING_EXTERNAL: "waiting for a worker"}
LOST = "The runtime went away (closed, or it stopped answering)"


def visible_text(markup: str) -> str:
    """What a person reads: the markup without tags, attributes, scripts and styles."""
    markup = re.sub(r"<(script|style|title|desc)\b.*?</\1>", " ", markup, flags=re.S)
    return htmllib.unescape(re.sub(r"""<(?:[^"'>]|"[^"]*"|'[^']*')*>""", " ", markup))


def badges(markup: str) -> list[tuple[str, str, str]]:
    """(class, title, text) of every state badge."""
    found = re.findall(r'<span class="badge([^"]*)"[^>]*?title="([^"]*)"[^>]*>(.*?)</span>', markup, re.S)
    return [(cls.strip(), title, text) for cls, title, text in found if "st-" in cls]


# ---- the map -------------------------------------------------------------------------------------
def test_every_state_has_words_and_no_label_is_a_code():
    assert set(presenters.STATE_LABELS) == set(S)
    for state in S:
        label = state_label(state.value)
        assert label and "_" not in label
    assert {s: state_label(s.value) for s in WORDS} == WORDS
    assert state_label("no-such-state") == "no-such-state"


@pytest.mark.parametrize(("raw", "text", "coded"), [
    ("runtime_lost", LOST, True),
    ("conflicting_result: chapter-1/continuity",
     "A different result arrived for handoff chapter-1/continuity after one was consumed", True),
    # Free text (a person's or an agent's) is shown as written, whatever it looks like.
    ("needs the era of the lighthouse", "needs the era of the lighthouse", False),
    ("runtime_lost: but said by an agent", "runtime_lost: but said by an agent", False),
    ("conflicting_result", "conflicting_result", False),
    ("conflicting_result: ", "conflicting_result: ", False),
    ("binding invalidated: framework 1→2", "binding invalidated: framework 1→2", False),
    ("", "", False),
])
def test_reasons_known_codes_become_sentences_the_rest_is_as_written(raw, text, coded):
    got = reason(raw)
    assert (got.text, got.coded, got.code) == (text, coded, raw)


def test_event_summaries_use_the_words():
    assert describe("session.transitioned", {"from": "running", "to": "awaiting_user", "reason": "a question"}) \
        == "running → waiting for a person · a question"
    assert describe("session.transitioned", {"from": "running", "to": "failed", "reason": "runtime_lost"}) \
        == f"running → failed · {LOST}"
    assert describe("run.ended", {"seq": 1, "state": "interrupted", "reason": "runtime_lost"}) == f"run #1 interrupted · {LOST}"


def test_diagram_nodes_carry_words_that_fit_their_box():
    d = build_diagram("awaiting_external", [("created", "running"), ("running", "awaiting_external")])
    node = {n.state: n for n in d.nodes}
    assert node["awaiting_user"].lines == ["waiting for", "a person"]
    assert node["awaiting_external"].lines == ["waiting for", "a worker"]
    assert node["running"].lines == ["running"]
    assert all(len(line) <= presenters.NODE_LINE_CHARS for n in d.nodes for line in n.lines)


# ---- the pages -------------------------------------------------------------------------------------
def test_the_overview_says_states_in_words_and_keeps_the_codes(mgr_client, make_session, project):
    asking = make_session(run=True)
    session_actions.transition_session(caller_for(project), asking.id, "awaiting_user", reason="which era?")
    external = make_session(run=True)
    session_actions.transition_session(caller_for(project), external.id, "awaiting_external", reason="a worker")
    page = mgr_client.get("/").content.decode()
    text = visible_text(page)
    for code in ("awaiting_user", "awaiting_external"):
        assert code not in text, f"{code} is printed where a person reads it"
    row = re.search(rf'<tr id="session-{asking.id}".*?</tr>', page, re.S).group(0)
    assert 'data-state="awaiting_user"' in row
    assert ("st-awaiting_user", "awaiting_user", "waiting for a person") in badges(row)
    # The counts say it in words too; their links and the filter keep the code.
    assert ("st-awaiting_external", "awaiting_external", "waiting for a worker") in badges(page.split('class="counts"')[1])
    assert '<option value="awaiting_user">waiting for a person</option>' in page
    assert 'href="?state=awaiting_user"' in page
    filtered = mgr_client.get("/?state=awaiting_user").content.decode()
    assert re.findall(r'<tr id="session-(\d+)"', filtered) == [str(asking.id)]
    assert '<option value="awaiting_user" selected>waiting for a person</option>' in filtered
    # The map for the live updates, once, the same as the server's.
    words = re.findall(r'<script id="nf-words" type="application/json">(.*?)</script>', page, re.S)
    assert len(words) == 1 and json.loads(words[0]) == presenters.words()
    # A row fetched live is rendered the same way.
    fetched = mgr_client.get(f"/sessions/{asking.id}/row/").content.decode()
    assert ("st-awaiting_user", "awaiting_user", "waiting for a person") in badges(fetched)


def test_a_lost_runtime_reads_as_a_sentence_on_the_session_page(mgr_client, make_session):
    session = make_session(run=True)
    reconcile_expired_runtimes(now=timezone.now() + timedelta(hours=1))
    session.refresh_from_db()
    assert (session.status, session.status_reason) == (S.FAILED, "runtime_lost")
    page = mgr_client.get(f"/sessions/{session.id}/").content.decode()
    head = re.search(r'<span class="reason[^"]*"[^>]*>(.*?)</span>', page, re.S)
    assert head.group(1) == LOST and 'data-reason="runtime_lost"' in head.group(0) and 'title="runtime_lost"' in head.group(0)
    text = visible_text(page)
    assert "runtime_lost" not in text, "the code is not printed where a person reads it"
    assert 'data-reason="runtime_lost"' in page.split('data-panel="runtimes"')[1]  # the runtime's end, in words
    assert ("big st-failed", "failed", "failed") in badges(page)
    # The panels the live page re-fetches say the same.
    panels = mgr_client.get(f"/sessions/{session.id}/panels/").json()["panels"]
    assert LOST in panels["identity"] and "runtime_lost" not in visible_text(panels["identity"] + panels["runtimes"])
    assert json.loads(re.search(r'<script id="nf-words" type="application/json">(.*?)</script>', page, re.S)
                      .group(1)) == presenters.words()


def test_someone_elses_words_are_quoted_as_written(mgr_client, make_session, project):
    session = make_session(run=True)
    said = "runtime_lost? no — <b>the author</b> must pick the era"
    session_actions.transition_session(caller_for(project), session.id, "awaiting_user", reason=said)
    page = mgr_client.get(f"/sessions/{session.id}/").content.decode()
    head = re.search(r'<span class="reason"[^>]*>(.*?)</span>', page, re.S).group(1)
    assert htmllib.unescape(head) == f"“{said}”" and "<b>" not in head
    assert ("big st-awaiting_user", "awaiting_user", "waiting for a person") in badges(page)
    # The diagram: the current state lit in words (two lines in its box), the code in data-state.
    diagram = page.split('data-panel="diagram"')[1].split("</section>")[0]
    assert re.search(r'data-state="awaiting_user" aria-current="true">.*?<tspan[^>]*>waiting for</tspan><tspan[^>]*>a person</tspan>',
                     diagram, re.S)
    assert "awaiting_user" not in visible_text(diagram)
