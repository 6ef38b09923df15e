"""Read-side helpers for the manager pages: the lifecycle diagram, the run timeline, event
summaries and session rows. Plain functions of model rows; no writes.

The diagram's nodes and edges come from ``session_runtime.LIFECYCLE`` (the contract's table,
never a copy); only the *positions* of the nine states are chosen here, for readability.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Max
from django.utils import timezone

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.models import Checkpoint, Event, Run, RuntimeAttachment, Session

S = rt.SessionStatus
STATES: list[str] = [s.value for s in S]

# ------------------------------------------------------------------------------------
# Lifecycle diagram
# ------------------------------------------------------------------------------------
NODE_W, NODE_H = 146, 36
DIAGRAM_W, DIAGRAM_H = 980, 390

#: Where each state sits (centre). Left to right: start, work, waiting, outcomes, end-of-life.
_POS: dict[S, tuple[int, int]] = {
    S.CREATED: (88, 195),
    S.RUNNING: (268, 195),
    S.IDLE: (480, 85),
    S.AWAITING_USER: (480, 195),
    S.AWAITING_EXTERNAL: (480, 305),
    S.COMPLETED: (690, 85),
    S.FAILED: (690, 305),
    S.STALE: (888, 145),
    S.TERMINATED: (888, 250),
}
#: Edges that would cut through the middle column are routed around it (cubic, over/under).
_DETOURS: dict[tuple[S, S], tuple[str, int]] = {
    (S.RUNNING, S.STALE): ("over", 8),
    (S.RUNNING, S.TERMINATED): ("under", DIAGRAM_H - 8),
}


@dataclass
class DiagramNode:
    state: str
    x: int
    y: int
    classes: str
    visits: int

    @property
    def left(self) -> int:
        return self.x - NODE_W // 2

    @property
    def top(self) -> int:
        return self.y - NODE_H // 2


@dataclass
class DiagramEdge:
    source: str
    target: str
    d: str
    classes: str
    count: int
    label_x: float
    label_y: float


@dataclass
class Diagram:
    nodes: list[DiagramNode]
    edges: list[DiagramEdge]
    current: str
    allowed: list[str]
    path: list[str]
    width: int = DIAGRAM_W
    height: int = DIAGRAM_H
    node_w: int = NODE_W
    node_h: int = NODE_H


def _border_point(cx: float, cy: float, dx: float, dy: float, pad: float = 0.0) -> tuple[float, float]:
    """Where a ray from a node's centre in direction (dx, dy) leaves its rectangle."""
    hw, hh = NODE_W / 2 + pad, NODE_H / 2 + pad
    if dx == 0 and dy == 0:
        return cx, cy
    scale = min(hw / abs(dx) if dx else math.inf, hh / abs(dy) if dy else math.inf)
    return cx + dx * scale, cy + dy * scale


def _edge_path(src: S, dst: S, bidirectional: bool) -> tuple[str, float, float]:
    (x1, y1), (x2, y2) = _POS[src], _POS[dst]
    detour = _DETOURS.get((src, dst))
    if detour:
        side, lane = detour
        sy = y1 - NODE_H / 2 if side == "over" else y1 + NODE_H / 2
        ey = y2 - NODE_H / 2 - 4 if side == "over" else y2 + NODE_H / 2 + 4
        d = f"M{x1:.0f},{sy:.0f} C{x1:.0f},{lane} {x2:.0f},{lane} {x2:.0f},{ey:.0f}"
        return d, (x1 + x2) / 2, lane + (14 if side == "over" else -6)
    dx, dy = x2 - x1, y2 - y1
    length = math.hypot(dx, dy)
    # Two-way pairs bend apart so both arrows stay visible.
    bend = 16.0 if bidirectional else 0.0
    nx, ny = -dy / length, dx / length
    mx, my = (x1 + x2) / 2 + nx * bend, (y1 + y2) / 2 + ny * bend
    sx, sy = _border_point(x1, y1, mx - x1, my - y1)
    ex, ey = _border_point(x2, y2, mx - x2, my - y2, pad=4)
    if bend:
        d = f"M{sx:.1f},{sy:.1f} Q{mx:.1f},{my:.1f} {ex:.1f},{ey:.1f}"
    else:
        d = f"M{sx:.1f},{sy:.1f} L{ex:.1f},{ey:.1f}"
    return d, mx + nx * 8, my + ny * 8


def transition_path(session_id: int, limit: int = 500) -> list[tuple[str, str]]:
    """The (from, to) pairs this session has taken, oldest first (from its event log)."""
    rows = (
        Event.objects.filter(session_id=session_id, type="session.transitioned")
        .order_by("-id").values_list("payload", flat=True)[:limit]
    )
    pairs = [(p.get("from"), p.get("to")) for p in reversed(list(rows))]
    return [(a, b) for a, b in pairs if a in STATES and b in STATES]


def build_diagram(status: str, taken: Sequence[tuple[str, str]]) -> Diagram:
    current = S(status)
    allowed = rt.LIFECYCLE[current]
    edge_counts = Counter(taken)
    visits = Counter([S.CREATED.value] + [b for _, b in taken])
    nodes = []
    for state in S:
        classes = [f"st-{state.value}"]
        if state is current:
            classes.append("current")
        elif state in allowed:
            classes.append("next")
        if visits[state.value]:
            classes.append("visited")
        x, y = _POS[state]
        nodes.append(DiagramNode(state.value, x, y, " ".join(classes), visits[state.value]))
    edges = []
    for src, targets in rt.LIFECYCLE.items():
        for dst in sorted(targets, key=lambda s: STATES.index(s.value)):
            d, lx, ly = _edge_path(src, dst, src in rt.LIFECYCLE[dst])
            count = edge_counts[(src.value, dst.value)]
            classes = ["edge"]
            if count:
                classes.append("taken")
            if src is current:
                classes.append("next")
            edges.append(DiagramEdge(src.value, dst.value, d, " ".join(classes), count, lx, ly))
    path = [S.CREATED.value] + [b for _, b in taken]
    return Diagram(nodes, edges, current.value, sorted((s.value for s in allowed), key=STATES.index), path)


# ------------------------------------------------------------------------------------
# Run timeline: runs as bars, checkpoints as ticks, runtime generations as spans
# ------------------------------------------------------------------------------------
@dataclass
class Tick:
    left: float
    label: str
    title: str
    checkpoint_id: int


@dataclass
class Bar:
    label: str
    left: float
    width: float
    classes: str
    title: str
    ticks: list[Tick] = field(default_factory=list)


@dataclass
class Timeline:
    start: datetime
    end: datetime
    runs: list[Bar]
    runtimes: list[Bar]
    hidden_runs: int


def _pct(t: datetime, t0: datetime, span: float) -> float:
    return max(0.0, min(100.0, (t - t0).total_seconds() / span * 100.0))


def build_timeline(session: Session, runs: list[Run], checkpoints: list[Checkpoint],
                   runtimes: list[RuntimeAttachment], hidden_runs: int, now: datetime | None = None) -> Timeline:
    now = now or timezone.now()
    t0 = session.created_at
    ends = [r.ended_at or now for r in runs] + [a.ended_at or now for a in runtimes]
    live = any(r.ended_at is None for r in runs) or any(a.ended_at is None for a in runtimes)
    t1 = now if live or not ends else max(ends + [t0])
    starts = [r.started_at for r in runs] + [a.attached_at for a in runtimes]
    if hidden_runs and runs:
        t0 = min(starts)
    span = max((t1 - t0).total_seconds(), 1.0)
    by_run: dict[int, list[Checkpoint]] = {}
    for cp in checkpoints:
        by_run.setdefault(cp.run_id, []).append(cp)
    run_bars = []
    for run in runs:
        left = _pct(run.started_at, t0, span)
        right = _pct(run.ended_at or now, t0, span)
        state = run.state + (" abort-requested" if run.abort_requested_at and run.state == rt.RunState.OPEN else "")
        bar = Bar(
            label=f"run #{run.seq}", left=left, width=max(right - left, 0.6), classes=f"run-{state}",
            title=f"run #{run.seq} · gen {run.generation} · {run.task_mode} · {run.state}"
            + (f" ({run.end_reason})" if run.end_reason else ""),
        )
        for cp in by_run.get(run.id, []):
            bar.ticks.append(Tick(_pct(cp.created_at, t0, span), cp.boundary.replace("_", " "),
                                  f"checkpoint #{cp.seq} · {cp.boundary} · {cp.created_at:%Y-%m-%d %H:%M:%S} UTC", cp.id))
        run_bars.append(bar)
    runtime_bars = []
    for att in runtimes:
        left = _pct(att.attached_at, t0, span)
        right = _pct(att.ended_at or now, t0, span)
        runtime_bars.append(Bar(
            label=f"gen {att.generation}", left=left, width=max(right - left, 0.6), classes=f"rt-{att.state}",
            title=f"generation {att.generation} · {att.runtime_family} · {att.state}"
            + (f" ({att.end_reason})" if att.end_reason else ""),
        ))
    return Timeline(t0, t1, run_bars, runtime_bars, hidden_runs)


def compact_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "), default=str)


def pretty_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, indent=2, default=str)


# ------------------------------------------------------------------------------------
# Events and session rows
# ------------------------------------------------------------------------------------
def _scalar_items(payload: dict[str, Any]) -> str:
    parts = []
    for key, value in payload.items():
        if isinstance(value, (str, int, float, bool)) and value != "":
            parts.append(f"{key}={value}")
    text = " · ".join(parts)
    return text if len(text) <= 120 else text[:119] + "…"


def describe(event_type: str, payload: dict[str, Any]) -> str:
    """A one-line summary of an event for the feeds (mirrored by static/js/dashboard.js)."""
    p = payload or {}
    if event_type == "session.transitioned":
        text = f"{p.get('from')} → {p.get('to')}"
        return text + (f" · {p['reason']}" if p.get("reason") else "")
    if event_type == "session.created":
        return f"{p.get('role')} · {p.get('task_mode')} · {p.get('runtime_family')}"
    if event_type == "run.started":
        return f"run #{p.get('seq')} started · gen {p.get('generation')}"
    if event_type == "run.ended":
        return f"run #{p.get('seq')} {p.get('state')}" + (f" · {p['reason']}" if p.get("reason") else "")
    if event_type == "checkpoint.recorded":
        return f"checkpoint #{p.get('seq')} · {p.get('boundary')}"
    if event_type.startswith("runtime."):
        return f"generation {p.get('generation', '?')}" + (f" · {p['reason']}" if p.get("reason") else "")
    return _scalar_items(p)


@dataclass
class EventView:
    id: int
    type: str
    session_id: int | None
    project_id: int
    summary: str
    created_at: datetime
    to_state: str | None


def event_views(rows: Iterable[Event]) -> list[EventView]:
    out = []
    for e in rows:
        to_state = e.payload.get("to") if e.type == "session.transitioned" else None
        out.append(EventView(e.id, e.type, e.session_id, e.project_id, describe(e.type, e.payload), e.created_at,
                             to_state if to_state in STATES else None))
    return out


@dataclass
class SessionRow:
    session: Session
    runtime: RuntimeAttachment | None
    last_event: Event | None

    @property
    def runtime_problem(self) -> bool:
        """A lost runtime, or one still marked live whose lease has run out."""
        att = self.runtime
        if att is None:
            return False
        return att.state == rt.RuntimeState.LOST or (
            att.state == rt.RuntimeState.LIVE and att.lease_expires_at <= timezone.now()
        )

    @property
    def stands_out(self) -> bool:
        return self.session.status in (S.FAILED, S.STALE) or self.runtime_problem or bool(self.session.open_conflict)


def session_rows(sessions: list[Session]) -> list[SessionRow]:
    """Each session with its latest runtime attachment and last event (3 indexed queries)."""
    ids = [s.id for s in sessions]
    if not ids:
        return []
    latest: dict[int, RuntimeAttachment] = {
        a.session_id: a
        for a in RuntimeAttachment.objects.filter(session_id__in=ids).order_by("session_id", "-generation").distinct("session_id")
    }
    last_ids = (
        Event.objects.filter(session_id__in=ids).values("session_id").annotate(last=Max("id")).values_list("last", flat=True)
    )
    last_events = {e.session_id: e for e in Event.objects.filter(id__in=list(last_ids))}
    return [SessionRow(s, latest.get(s.id), last_events.get(s.id)) for s in sessions]
