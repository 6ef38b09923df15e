"""Run timeline: handoffs as spans on their run's bar (created → bound, or → now while they
wait), review gates as flags where the run opened them."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone as dt_timezone

import pytest

from novelforge_sessions.control.models import Handoff
from novelforge_sessions.dashboard import presenters
from novelforge_sessions.models import Run, Session
from reviews.models import ReviewGate
from tests.dashboard.test_handoffs import claim, deliver, handoff

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=dt_timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def fake_handoff(pk: int, start: float, end: float | None, state: str = "bound") -> Handoff:
    """An unsaved row: the timeline is a pure function of the rows it is given."""
    return Handoff(id=pk, run_id=1, logical_id=f"job-{pk}", state=state, attempt=1, created_at=at(start),
                   bound_at=at(end) if end is not None and state == "bound" else None,
                   cancelled_at=at(end) if end is not None and state == "cancelled" else None,
                   lease_expires_at=at(start + 60) if state == "claimed" else None, lease_holder="w-1")


def timeline(handoffs: list[Handoff], gates: list[ReviewGate] = ()) -> presenters.Timeline:
    session = Session(id=1, created_at=T0)
    run = Run(id=1, seq=1, generation=1, task_mode="drafting", state="open", started_at=T0)
    return presenters.build_timeline(session, [run], [], [], 0, now=at(100), handoffs=handoffs, gates=gates)


def test_handoff_spans_run_from_creation_to_binding_or_now():
    bar = timeline([fake_handoff(1, 10, 30), fake_handoff(2, 40, None, state="claimed")]).runs[0]
    spans = {s.handoff_id: s for s in bar.spans}
    assert (round(spans[1].left), round(spans[1].width)) == (10, 20)
    assert (round(spans[2].left), round(spans[2].width)) == (40, 60), "still waiting: drawn up to now"
    assert spans[1].classes == "hs-bound" and spans[2].classes == "hs-claimed"
    assert spans[2].lease_expires_at == at(100) and spans[1].lease_expires_at is None
    assert "lease held by w-1 until 2026-01-01 12:01:40 UTC" in spans[2].title
    assert {s.row for s in bar.spans} == {0}, "they do not overlap: one row"
    assert bar.span_rows == 1 and bar.track_height > presenters.TRACK_PX


def test_overlapping_spans_are_stacked_and_the_overflow_counted():
    overlapping = [fake_handoff(n, n, None, state="pending") for n in range(1, presenters.MAX_SPAN_ROWS + 3)]
    bar = timeline(overlapping).runs[0]
    assert [s.row for s in bar.spans] == list(range(presenters.MAX_SPAN_ROWS))
    assert bar.hidden_spans == 2 and bar.span_rows == presenters.MAX_SPAN_ROWS
    # A later, non-overlapping span reuses the first free row.
    bar = timeline([fake_handoff(1, 0, 10), fake_handoff(2, 5, 50), fake_handoff(3, 20, 30)]).runs[0]
    assert [s.row for s in sorted(bar.spans, key=lambda s: s.handoff_id)] == [0, 1, 0]


def test_review_gates_are_flags_on_their_run():
    gates = [ReviewGate(id=7, run_id=1, route="page", state="complete", outcome="revise", bound_verdicts=1,
                        required_verdicts=1, created_at=at(50)),
             ReviewGate(id=8, run_id=1, route="relay", state="pending", outcome="", bound_verdicts=0,
                        required_verdicts=2, created_at=at(75))]
    flags = timeline([], gates).runs[0].flags
    assert [(f.gate_id, round(f.left), f.classes) for f in flags] == [
        (7, 50, "gate-complete dc-revise"), (8, 75, "gate-pending")]
    assert "review gate #8 · relay route · pending · 0 of 2 verdicts" in flags[1].title


@pytest.mark.django_db
def test_the_session_page_draws_spans_and_flags(mgr_client, project):
    from tests.reviews.factories import make_world

    world = make_world(project)
    h = claim(handoff(world.writer, "chapter-01/continuity"))
    deliver(h, {"ok": True})
    gate = world.gate(route="page", reviewers=["alice"])
    html = mgr_client.get(f"/sessions/{world.writer.id}/").content.decode()
    tl = re.search(r'<section class="card" data-panel="timeline".*?</section>', html, re.S).group(0)
    assert re.search(rf'class="tl-span hs-bound"[^>]*data-handoff-id="{h.id}"', tl)
    assert ">chapter-01/continuity<" in tl
    assert re.search(rf'class="tl-flag gate-pending"[^>]*data-gate-id="{gate.id}"', tl)
    # The legend is generated from what is drawn, with the drawn elements' own classes.
    assert 'data-legend="tl-span hs-bound"><span class="swatch tl-span hs-bound" aria-hidden="true"></span>handoff bound<' in tl
    assert 'data-legend="tl-flag gate-pending"><span class="swatch tl-flag gate-pending" aria-hidden="true"></span>review gate pending<' in tl


def test_a_run_with_more_checkpoints_than_the_track_draws_its_newest_and_counts_the_rest(mgr_client, make_session):
    """A long graph's run holds more checkpoints than a track has pixels: the page reads and draws
    the newest ``TIMELINE_CHECKPOINTS`` (from the session's index, however many there are) and
    says how many earlier ones it left out."""
    from novelforge_sessions.dashboard.views import TIMELINE_CHECKPOINTS
    from novelforge_sessions.models import Checkpoint

    session = make_session(run=True)
    run = Run.objects.get(session=session)
    total = TIMELINE_CHECKPOINTS + 37
    Checkpoint.objects.bulk_create(
        Checkpoint(session=session, run=run, seq=seq, boundary="context_freeze", cursor={"step": seq}, size_bytes=12)
        for seq in range(1, total + 1))
    Run.objects.filter(id=run.id).update(checkpoint_count=total)

    html = mgr_client.get(f"/sessions/{session.id}/").content.decode()
    tl = re.search(r'<section class="card" data-panel="timeline".*?</section>', html, re.S).group(0)
    ticks = re.findall(r'class="tl-tick" [^>]*title="checkpoint #(\d+) ', tl)
    assert len(ticks) == TIMELINE_CHECKPOINTS
    assert {int(t) for t in ticks} == set(range(38, total + 1))  # the newest; seq 1 to 37 are not drawn
    assert 'data-hidden-checkpoints="37"' in tl and "+37 earlier checkpoints" in tl
