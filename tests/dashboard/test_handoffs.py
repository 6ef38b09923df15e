"""Session page: the handoffs still waiting (with their lease countdown), the finished ones
folded, server-rendered first and re-rendered by the live panels endpoint."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from novelforge_sessions.control.handoffs import cancel_handoff, claim_handoff, create_handoff
from novelforge_sessions.control.results import deliver_result
from novelforge_sessions.errors import ConflictingResult
from novelforge_sessions.control.models import Handoff
from novelforge_sessions.dashboard import presenters
from tests.support.factories import caller_for

pytestmark = pytest.mark.django_db


def handoff(session, logical_id: str, caps: tuple[str, ...] = (), timeout: int = 300) -> Handoff:
    run = session.runs.get(state="open")
    return create_handoff(caller_for(session.project), run.id, logical_id=logical_id,
                          required_capabilities=list(caps), timeout_seconds=timeout).handoff


def claim(h: Handoff, worker: str = "w-1") -> Handoff:
    claimed = claim_handoff(caller_for(h.project), worker=worker, capabilities=list(h.required_capabilities), handoff_id=h.id)
    assert claimed is not None
    return claimed


def deliver(h: Handoff, result: dict) -> None:
    deliver_result(caller_for(h.project), h.id, fencing_token=h.fencing_token, job_fingerprint=h.job_fingerprint,
                   result=result)


def panel(html: str) -> str:
    """The handoffs panel of a rendered session page."""
    match = re.search(r'<section class="card" data-panel="handoffs".*?</section>', html, re.S)
    assert match, "the session page has a handoffs panel"
    return match.group(0)


def row(html: str, h: Handoff) -> str:
    match = re.search(rf'<tr id="handoff-{h.id}".*?</tr>', html, re.S)
    assert match, f"no row for handoff {h.id}"
    return match.group(0)


def test_waiting_handoffs_are_listed_with_their_lease(mgr_client, make_session):
    session = make_session(run=True)
    first = handoff(session, "chapter-1/continuity", caps=("continuity",), timeout=90)
    second = handoff(session, "chapter-1/style")
    first = claim(first, worker="w-continuity")
    html = panel(mgr_client.get(f"/sessions/{session.id}/").content.decode())

    claimed = row(html, first)
    assert 'data-state="claimed"' in claimed and "w-continuity" in claimed and "continuity</span>" in claimed
    # Job fingerprint: short on screen, the whole value for the copy button.
    fp = first.job_fingerprint
    assert f"{fp[:11]}…{fp[-4:]}" in claimed and f'data-copy="{fp}"' in claimed
    assert re.search(r'<td class="num">1</td>', claimed), "attempt 1"
    # The countdown ticks in JS from data-expires; the exact time is on hover; without JS the
    # server's text already says until when.
    expires = first.lease_expires_at
    assert f'data-expires="{expires.isoformat()}"' in claimed
    assert f'title="lease expires {expires:%Y-%m-%d %H:%M:%S} UTC' in claimed
    assert f"until {expires:%H:%M:%S} UTC" in claimed and "expired" not in claimed

    pending = row(html, second)
    assert 'data-state="pending"' in pending and "not claimed" in pending and "waiting for a worker" in pending
    assert html.index(f'id="handoff-{first.id}"') < html.index(f'id="handoff-{second.id}"'), "oldest first"
    assert 'data-field="open-handoffs">2<' in html and "Recently finished" not in html


def test_an_expired_lease_reads_expired_without_javascript(mgr_client, make_session):
    session = make_session(run=True)
    h = claim(handoff(session, "job-expiring", timeout=60))
    # As if the worker went silent for two minutes.
    Handoff.objects.filter(id=h.id).update(lease_expires_at=timezone.now() - timedelta(seconds=60))
    claimed = row(panel(mgr_client.get(f"/sessions/{session.id}/").content.decode()), h)
    assert "lease-expired" in claimed and "claimable again" in claimed
    assert re.search(r'class="countdown expired"[^>]*>expired</span>', claimed)


def test_bound_and_cancelled_handoffs_fold_away(mgr_client, make_session):
    session = make_session(run=True)
    done = claim(handoff(session, "job-done"))
    dropped = handoff(session, "job-dropped")
    deliver(done, {"verdict": "consistent"})
    cancel_handoff(caller_for(session.project), dropped.id, reason="not needed")
    session.refresh_from_db()
    assert session.status == "running", "nothing of the run is pending any more"

    html = panel(mgr_client.get(f"/sessions/{session.id}/").content.decode())
    assert "Nothing is waiting on an external worker." in html and 'data-field="open-handoffs">0<' in html
    folded = re.search(r'<details class="ho-finished".*?</details>', html, re.S).group(0)
    assert "<details" in folded and " open" not in folded.split(">", 1)[0], "folded by default"
    assert 'data-state="bound"' in row(folded, done) and "result consumed" in row(folded, done)
    assert 'data-state="cancelled"' in row(folded, dropped)
    # Most recently finished first.
    assert folded.index(f'id="handoff-{dropped.id}"') < folded.index(f'id="handoff-{done.id}"')


def test_a_conflicting_result_keeps_the_handoff_in_the_open_list(mgr_client, make_session):
    session = make_session(run=True)
    h = claim(handoff(session, "job-conflict"))
    deliver(h, {"verdict": "consistent"})
    with pytest.raises(ConflictingResult):
        deliver(h, {"verdict": "something else"})
    open_rows = panel(mgr_client.get(f"/sessions/{session.id}/").content.decode()).split("Recently finished")[0]
    conflicted = row(open_rows, h)
    assert 'data-state="conflicted"' in conflicted and "a manager must resolve it" in conflicted


def test_a_conflict_after_a_resolved_one_is_open_again(mgr_client, make_session):
    """Defect: the open list asked for ``conflict_resolved_at IS NULL`` besides the state, so a
    second conflict on a handoff whose first one was resolved folded away as finished. The
    shared predicate (``lifecycles.conflict_open``) is the state: resolving moves it to bound."""
    from novelforge_sessions.control.results import resolve_conflict

    session = make_session(run=True)
    h = claim(handoff(session, "job-twice"))
    deliver(h, {"verdict": "consistent"})
    with pytest.raises(ConflictingResult):
        deliver(h, {"verdict": "something else"})
    resolve_conflict(caller_for(session.project, ["read", "write", "approve"]), h.id, resolution="the first stands")
    with pytest.raises(ConflictingResult):
        deliver(h, {"verdict": "a third answer"})
    h.refresh_from_db()
    assert h.state == "conflicted" and h.conflict_resolved_at is not None
    assert [r.handoff.id for r in presenters.session_handoffs(session.id).open] == [h.id]
    open_rows = panel(mgr_client.get(f"/sessions/{session.id}/").content.decode()).split("Recently finished")[0]
    assert "a manager must resolve it" in row(open_rows, h)


def test_the_live_panels_endpoint_re_renders_the_handoffs(mgr_client, make_session):
    session = make_session(run=True)
    before = mgr_client.get(f"/sessions/{session.id}/panels/").json()["panels"]["handoffs"]
    assert "Nothing is waiting" in before
    h = handoff(session, "job-live")
    data = mgr_client.get(f"/sessions/{session.id}/panels/").json()
    assert data["status"] == "awaiting_external"
    assert f'id="handoff-{h.id}"' in data["panels"]["handoffs"] and 'data-state="pending"' in data["panels"]["handoffs"]


def test_handoff_rows_know_live_and_expired_leases(make_session):
    session = make_session(run=True)
    h = claim(handoff(session, "job-clock", timeout=30))
    now = timezone.now()
    live = presenters.session_handoffs(session.id, now=now)
    assert [(r.handoff.id, r.lease_live, r.lease_expired) for r in live.open] == [(h.id, True, False)]
    later = presenters.session_handoffs(session.id, now=now + timedelta(seconds=31))
    assert [(r.lease_live, r.lease_expired, r.state_note) for r in later.open] == [
        (False, True, "lease expired: claimable again")]


def test_the_open_list_is_capped_and_counted(make_session, monkeypatch):
    monkeypatch.setattr(presenters, "OPEN_HANDOFFS_SHOWN", 2)
    session = make_session(run=True)
    made = [handoff(session, f"job-{n}").id for n in range(3)]
    listed = presenters.session_handoffs(session.id)
    assert [r.handoff.id for r in listed.open] == made[:2] and listed.open_total == 3


def test_the_counts_stop_at_the_cap_and_the_panel_says_more_than(mgr_client, make_session, monkeypatch):
    """A session with more handoffs than a page should count says "N+" (``counting.COUNT_CAP``)
    instead of reading them all to say how many."""
    from novelforge_sessions import counting

    monkeypatch.setattr(presenters, "OPEN_HANDOFFS_SHOWN", 2)
    monkeypatch.setattr(presenters, "FINISHED_HANDOFFS_SHOWN", 1)
    monkeypatch.setattr(counting, "COUNT_CAP", 3)
    session = make_session(run=True)
    waiting = [handoff(session, f"job-{n}").id for n in range(5)]
    for n in range(2):
        deliver(claim(handoff(session, f"done-{n}")), {"ok": True})
    listed = presenters.session_handoffs(session.id)
    assert [r.handoff.id for r in listed.open] == waiting[:2]
    assert (listed.open_total, listed.finished_total) == (4, 2)  # counted up to the cap + 1; 2 finished in all

    html = panel(mgr_client.get(f"/sessions/{session.id}/").content.decode())
    assert 'data-field="open-handoffs">3+<' in html
    assert "3+ waiting in all; the oldest 2 are shown." in html
    assert "(1 of 2)" in html


def test_session_page_queries_do_not_grow_with_the_handoffs(mgr_client, make_session):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries(session_id: int) -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert mgr_client.get(f"/sessions/{session_id}/").status_code == 200
            assert mgr_client.get(f"/sessions/{session_id}/panels/").status_code == 200
        return len(ctx.captured_queries)

    session = make_session(run=True)
    handoff(session, "job-0")
    small = queries(session.id)
    for n in range(1, 5):
        h = handoff(session, f"job-{n}")
        if n % 2:
            h = claim(h)
        if n == 3:
            deliver(h, {"ok": True})
    assert queries(session.id) == small


#: (event type, payload, one-line summary): checked here and, against NF.describe, in the browser.
SUMMARY_CASES = [
    # the role in words; the task mode and the runtime family are the agent's own names, as written
    ("session.created", {"role": "semantic_reviewer", "memory_policy": "none", "task_mode": "chapter_check",
                         "runtime_family": "claude-code", "status": "created"}, "semantic reviewer · chapter_check · claude-code"),
    ("run.ended", {"seq": 1, "state": "interrupted", "reason": "closed by manager"}, "run #1 interrupted · closed by manager"),
    ("checkpoint.recorded", {"seq": 2, "boundary": "external_wait"}, "checkpoint #2 · external wait"),
    ("session.resumed", {"run_id": 7, "generation": 2, "checkpoint_id": 5, "reason": "resumed by manager",
                         "carried_over": {"handoffs": [{"handoff_id": 1}, {"handoff_id": 2}], "gates": [{"gate_id": 3}]}},
     "resumed on generation 2 · 2 unfinished handoffs carried over · 1 open review gate carried over · resumed by manager"),
    ("session.resumed", {"generation": 3, "checkpoint_id": None, "carried_over": {}},
     "resumed on generation 3 · no checkpoint: starts from the beginning"),
    ("handoff.created", {"logical_id": "c1/continuity", "required_capabilities": ["continuity"], "job_fingerprint": "x"},
     "handoff c1/continuity created · needs continuity"),
    ("handoff.claimed", {"logical_id": "c1", "worker": "w-1", "attempt": 2, "reclaimed_after_expiry": True},
     "handoff c1 claimed by w-1 · attempt 2 · previous lease expired"),
    ("handoff.result_consumed", {"logical_id": "c1", "result_hash": "sha256:…"}, "handoff c1 · result consumed"),
    ("handoff.result_conflict", {"logical_id": "c1"}, "handoff c1 · CONFLICTING result: hard stop"),
    ("handoff.waiting_long", {"logical_id": "c1", "state": "pending", "waited_seconds": 1000, "threshold_seconds": 900},
     "handoff c1 · waiting for 16 min"),
    ("handoff.cancelled", {"logical_id": "c1", "reason": "not needed"}, "handoff c1 cancelled · not needed"),
    ("review.gate_opened", {"gate_id": 3, "route": "page", "required_verdicts": 1},
     "review gate #3 opened · page route · 1 verdict(s) needed"),
    ("review.verdict_bound", {"gate_id": 3, "bound_verdicts": 1, "required_verdicts": 2},
     "review gate #3 · verdict bound (1 of 2)"),
    ("review.gate_completed", {"gate_id": 3, "state": "complete"}, "review gate #3 · completed"),
    ("write_intent.approved", {"intent_id": 9}, "write intent #9 approved"),
    ("write_intent.created", {"intent_id": 9, "kind": "framework.change"}, "write intent #9 created · framework.change"),
    ("framework.changed", {"intent_id": 9, "before": {"framework_version": "1"}, "after": {"framework_version": "2"}},
     "framework 1 → 2 · write intent #9"),
    ("authority.settled", {"intent_id": 4, "before": {"authority_version": 1},
                           "after": {"authority_version": 2, "lock_fingerprint": "sha256:0123456789abcdef"}},
     "authority v1 → v2 · lock sha256:01234567… · write intent #4"),
]


@pytest.mark.parametrize(("event_type", "payload", "summary"), SUMMARY_CASES)
def test_feed_summaries_of_control_plane_and_review_events(event_type, payload, summary):
    """One line each in the feeds (static/js/dashboard.js mirrors these)."""
    assert presenters.describe(event_type, payload) == summary
