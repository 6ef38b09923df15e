"""Manager pages (server side): the overview's "waiting for" column from the wait
registry, the project column only for several projects, the conflict resolved from the session
page (CSRF form, manager permission, refusals write nothing), the timeline's geometry (minimum
widths, label lanes, a legend carrying the bars' own classes, every run drawn)."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone as dt_timezone

import pytest

from novelforge_sessions.actions import sessions as session_actions
from novelforge_sessions.control import waits
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.dashboard import presenters
from novelforge_sessions.errors import ConflictingResult
from novelforge_sessions.models import Checkpoint, Event, Membership, Run, Session
from tests.support.factories import caller_for
from tests.dashboard.conftest import logged_in, make_user
from tests.dashboard.test_handoffs import claim, deliver, handoff

pytestmark = pytest.mark.django_db


def row_of(html: str, session_id: int) -> str:
    match = re.search(rf'<tr id="session-{session_id}".*?</tr>', html, re.S)
    assert match, f"no row for session {session_id}"
    return match.group(0)


def waiting_cell(html: str, session_id: int) -> str:
    return re.search(r'<td class="waiting" data-field="waiting">(.*?)</td>', row_of(html, session_id), re.S).group(1)


# ---- the overview: waiting for, project column ------------------------------------------------------------
def test_the_waiting_for_column_names_the_handoff_or_the_question_and_since_when(mgr_client, make_session, project):
    external = make_session(run=True)
    h = handoff(external, "chapter-2/continuity")
    asking = make_session(run=True)
    session_actions.transition_session(caller_for(project), asking.id, "awaiting_user", reason="which era is the lighthouse?")
    busy = make_session(run=True)
    html = mgr_client.get("/").content.decode()

    cell = waiting_cell(html, external.id)
    assert "handoff chapter-2/continuity (pending)" in cell and "wait-handoff" in cell
    since = re.search(r'since <time datetime="([^"]+)"', cell).group(1)
    assert datetime.fromisoformat(since) == Handoff.objects.get(id=h.id).created_at
    cell = waiting_cell(html, asking.id)
    assert "a question: which era is the lighthouse?" in cell and "since <time" in cell
    assert "—" in waiting_cell(html, busy.id), "a running session waits on nothing"


def test_waiting_for_comes_from_the_wait_registry_in_one_query_per_kind(make_session, django_assert_num_queries):
    sessions = [make_session(run=True) for _ in range(3)]
    for n, s in enumerate(sessions):
        handoff(s, f"job-{n}")
    kinds = [k for k in waits.kinds() if k.waiting_many is not None]
    assert {k.name for k in kinds} >= {"handoff", "review_gate"}, "both registered kinds say what they wait on"
    with django_assert_num_queries(len(kinds)):
        found = waits.waiting_for_sessions([s.id for s in sessions])
    assert {sid: [w.label for w in items] for sid, items in found.items()} == {
        s.id: [f"handoff job-{n} (pending)"] for n, s in enumerate(sessions)
    }


def test_the_project_column_only_when_the_manager_has_several_projects(mgr_client, manager, make_session, other_project):
    s = make_session()
    html = mgr_client.get("/").content.decode()
    assert "<th scope=\"col\">Project</th>" not in html and 'class="project"' not in row_of(html, s.id)
    assert 'class="project"' not in mgr_client.get(f"/sessions/{s.id}/row/").content.decode()
    Membership.objects.create(user=manager, project=other_project, role=Membership.Role.MANAGER)
    html = mgr_client.get("/").content.decode()
    assert "<th scope=\"col\">Project</th>" in html and 'class="project"' in row_of(html, s.id)
    assert 'class="project"' in mgr_client.get(f"/sessions/{s.id}/row/").content.decode()
    # Filtered to one project, the column says nothing again.
    assert "<th scope=\"col\">Project</th>" not in mgr_client.get(f"/?project={s.project_id}").content.decode()


# ---- the conflict, resolved from the page ----------------------------------------------------------------
def conflicted(session) -> Handoff:
    h = claim(handoff(session, "chapter-3/style"))
    deliver(h, {"verdict": "consistent"})
    with pytest.raises(ConflictingResult):
        deliver(h, {"verdict": "the narrator changed"})
    return h


def csrf_token(html: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


def test_the_session_page_shows_the_open_conflict_with_both_results_and_resolves_it(mgr_client, make_session):
    session = make_session(run=True)
    h = conflicted(session)
    html = mgr_client.get(f"/sessions/{session.id}/").content.decode()
    panel = re.search(r'<section class="card conflicts-card" data-panel="conflicts" id="conflicts">(.*?)</section>\s*<div class="session-grid">',
                      html, re.S).group(1)
    assert 'href="#conflicts"' in html, "the identity alert leads to the conflict"
    consumed = re.search(r'<section class="result consumed".*?</section>', panel, re.S).group(0)
    later = re.search(r'<section class="result conflicting".*?</section>', panel, re.S).group(0)
    assert "&quot;verdict&quot;: &quot;consistent&quot;" in consumed and "narrator" not in consumed
    assert "&quot;verdict&quot;: &quot;the narrator changed&quot;" in later
    action = f'/sessions/{session.id}/handoffs/{h.id}/resolve-conflict/'
    assert f'action="{action}"' in panel and "csrfmiddlewaretoken" in panel

    resp = mgr_client.post(action, {"resolution": "kept the first; the second was a retry", "csrfmiddlewaretoken": csrf_token(html)})
    assert resp.status_code == 302
    h.refresh_from_db()
    session.refresh_from_db()
    assert h.state == "bound" and h.conflict_resolution == "kept the first; the second was a retry"
    assert session.open_conflict == ""
    assert Event.objects.filter(session_id=session.id, type="handoff.conflict_resolved").count() == 1
    after = mgr_client.get(f"/sessions/{session.id}/").content.decode()
    assert 'id="conflicts"></section>' in after, "no open conflict: the panel is empty"
    assert "Conflict on handoff chapter-3/style resolved" in after


def _nothing_changed(session, h) -> None:
    h.refresh_from_db()
    session.refresh_from_db()
    assert h.state == "conflicted" and h.conflict_resolution == "" and session.open_conflict
    assert not Event.objects.filter(session_id=session.id, type="handoff.conflict_resolved").exists()


def test_resolving_refusals_write_nothing(mgr_client, manager, make_session, project, other_project):
    session = make_session(run=True)
    h = conflicted(session)
    action = f'/sessions/{session.id}/handoffs/{h.id}/resolve-conflict/'
    token = csrf_token(mgr_client.get(f"/sessions/{session.id}/").content.decode())
    # Without the CSRF token.
    assert mgr_client.post(action, {"resolution": "x"}).status_code == 403
    _nothing_changed(session, h)
    # An empty resolution: the typed error on the page.
    resp = mgr_client.post(action, {"resolution": "  ", "csrfmiddlewaretoken": token}, follow=True)
    assert "resolution must say how the conflict was resolved" in resp.content.decode()
    _nothing_changed(session, h)
    # A reviewer of the project, and a manager of another project: 404, never 403.
    reviewer = logged_in(make_user("rita", project, role=Membership.Role.REVIEWER))
    assert reviewer.post(action, {"resolution": "x"}).status_code == 404
    stranger = logged_in(make_user("olga", other_project))
    assert stranger.post(action, {"resolution": "x"}).status_code == 404
    # A handoff of another session under this session's URL.
    other = make_session(run=True)
    assert mgr_client.post(f'/sessions/{other.id}/handoffs/{h.id}/resolve-conflict/',
                           {"resolution": "x", "csrfmiddlewaretoken": token}).status_code == 404
    _nothing_changed(session, h)


@pytest.mark.parametrize("resolution", ["kept\x00 the first", "kept \ud800 the first"])
def test_a_resolution_the_database_cannot_store_is_refused_by_the_action_in_plain_words(mgr_client, make_session, resolution):
    """A NUL in the resolution reached PostgreSQL from the page (a 500). The action
    itself refuses text it cannot store (422 naming ``resolution``), so the page and the API give
    the same refusal; the page says it in plain words and nothing is written."""
    from novelforge_sessions.control.results import resolve_conflict
    from novelforge_sessions.errors import ValidationFailed

    session = make_session(run=True)
    h = conflicted(session)
    with pytest.raises(ValidationFailed) as info:
        resolve_conflict(caller_for(session.project, ["read", "write", "approve"]), h.id, resolution=resolution)
    assert info.value.details == {"field": "resolution"}
    _nothing_changed(session, h)
    if "\x00" in resolution:  # a form post cannot carry a lone surrogate (Django decodes it as U+FFFD)
        action = f'/sessions/{session.id}/handoffs/{h.id}/resolve-conflict/'
        token = csrf_token(mgr_client.get(f"/sessions/{session.id}/").content.decode())
        resp = mgr_client.post(action, {"resolution": resolution, "csrfmiddlewaretoken": token}, follow=True)
        assert resp.status_code == 200
        assert ("Nothing was changed: the resolution contains a character that cannot be saved (a NUL character, U+0000)"
                in resp.content.decode())
        _nothing_changed(session, h)


# ---- the timeline ---------------------------------------------------------------------------------------
T0 = datetime(2026, 1, 1, 8, 0, tzinfo=dt_timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_sub_second_handoff_on_a_day_long_run_has_a_visible_width_and_its_own_row():
    session = Session(id=1, created_at=T0)
    run = Run(id=1, seq=1, generation=1, task_mode="drafting", state="open", started_at=T0)
    quick = [Handoff(id=n, run_id=1, logical_id=f"q-{n}", state="bound", attempt=1, created_at=at(3600 + n * 0.3),
                     bound_at=at(3600 + n * 0.3 + 0.2)) for n in range(3)]
    tl = presenters.build_timeline(session, [run], [], [], 0, now=at(86400), handoffs=quick)
    spans = tl.runs[0].spans
    assert all(s.width >= presenters.MIN_SPAN_PCT for s in spans)
    # Widened, they no longer fit one row: each gets its own.
    assert sorted(s.row for s in spans) == [0, 1, 2]
    bar = presenters.build_timeline(session, [Run(id=2, seq=2, generation=1, task_mode="x", state="completed",
                                                  started_at=at(86399.5), ended_at=at(86399.9))], [], [], 0,
                                    now=at(86400)).runs[0]
    assert bar.width >= presenters.MIN_BAR_PCT and bar.left + bar.width <= 100.0


def test_checkpoint_labels_go_into_lanes_and_the_rest_are_thinned_never_overlapping():
    session = Session(id=1, created_at=T0)
    run = Run(id=1, seq=1, generation=1, task_mode="drafting", state="open", started_at=T0)
    cps = [Checkpoint(id=n, run_id=1, seq=n, boundary="context_freeze", created_at=at(n)) for n in range(1, 9)]
    cps.append(Checkpoint(id=99, run_id=1, seq=99, boundary="before_long_handoff", created_at=at(99)))
    ticks = presenters.build_timeline(session, [run], cps, [], 0, now=at(100)).runs[0].ticks
    shown = [t for t in ticks if not t.thinned]
    assert {t.lane for t in shown} == {0, 1} and len(shown) < len(ticks)
    assert all(t.title.startswith("checkpoint #") for t in ticks), "a thinned label keeps its tooltip"
    width = lambda t: (len(t.label) * presenters._EST_CHAR_PX + 12) / presenters._EST_TRACK_PX * 100  # noqa: E731
    spans = [((t.left - width(t)) if t.flip else t.left, t.lane, width(t)) for t in shown]
    for i, (a, lane_a, wa) in enumerate(spans):
        for b, lane_b, wb in spans[i + 1:]:
            assert lane_a != lane_b or a + wa <= b or b + wb <= a, "two labels of one lane overlap"
    assert next(t for t in ticks if t.checkpoint_id == 99).flip, "a label at the end runs back from its tick"


def test_the_legend_carries_exactly_the_classes_of_what_is_drawn():
    session = Session(id=1, created_at=T0)
    runs = [Run(id=1, seq=1, generation=1, task_mode="x", state="interrupted", started_at=at(0), ended_at=at(10)),
            Run(id=2, seq=2, generation=2, task_mode="x", state="open", started_at=at(20))]
    hs = [Handoff(id=5, run_id=2, logical_id="j", state="pending", attempt=0, created_at=at(30))]
    tl = presenters.build_timeline(session, runs, [], [], 0, now=at(100), handoffs=hs)
    legend = {(i.element, i.classes) for i in tl.legend}
    drawn = {("tl-bar", b.classes) for b in tl.runs} | {("tl-span", s.classes) for b in tl.runs for s in b.spans}
    assert legend == drawn
    assert {i.label for i in tl.legend} == {"run interrupted", "open run", "handoff pending"}


def test_every_run_of_a_session_is_drawn(mgr_client, make_session, project):
    """A session's run must show (one did not, once). Every shown run has a bar with a width."""
    session = make_session(run=True)
    who = caller_for(project)
    from novelforge_sessions.actions import runs as run_actions
    first = session.runs.get()
    run_actions.end_run(who, first.id, outcome="completed")
    second = run_actions.start_run(who, session.id, cursor={"step": "again"})
    html = mgr_client.get(f"/sessions/{session.id}/").content.decode()
    lanes = re.findall(r'<div class="tl-lane" data-run-label="(run #\d+)">.*?<div class="tl-bar ([^"]+)" data-left="([\d.]+)" data-width="([\d.]+)"',
                       html, re.S)
    assert [(label, cls) for label, cls, _, _ in lanes] == [("run #1", "run-completed"), ("run #2", "run-open")]
    assert all(float(w) >= presenters.MIN_BAR_PCT and float(left) + float(w) <= 100.01 for _, _, left, w in lanes)
    assert second.seq == 2


def test_runtime_lost_names_its_generation():
    """``runtime.lost`` names its generation (it read "generation ?") (the browser test checks NF.describe live)."""
    payload = {"runtime_id": 7, "generation": 2, "reason": "runtime_lost"}
    assert presenters.describe("runtime.lost", payload) == "generation 2 · The runtime went away (closed, or it stopped answering)"


def test_a_session_waiting_on_a_review_gate_says_so(mgr_client, project):
    from tests.reviews.factories import make_world

    world = make_world(project)
    gate = world.gate(route="page", reviewers=["alice"])
    world.writer.refresh_from_db()
    assert world.writer.status in {"awaiting_user", "awaiting_external"}
    cell = waiting_cell(mgr_client.get("/").content.decode(), world.writer.id)
    assert f"review gate #{gate.id} (page route)" in cell and "wait-review_gate" in cell
    assert "a question" not in cell, "a registered wait is named, not guessed"
    assert re.search(r'since <time datetime="([^"]+)"', cell).group(1) == gate.created_at.isoformat()
