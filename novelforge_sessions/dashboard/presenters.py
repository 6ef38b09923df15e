"""Read-side helpers for the manager pages: the lifecycle diagram, the run timeline, event
summaries, session rows, pending handoffs, write intents awaiting approval and the top
navigation. Plain functions of model rows; no writes.

The diagram's nodes and edges come from ``lifecycles.SESSION.table`` (the contract's table,
never a copy); only the *positions* of the nine states are chosen here, for readability.
"""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Prefetch, Q
from django.utils import timezone
from django.utils.translation import get_language, gettext
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext, pgettext_lazy

from novelforge_sessions import event_types as ev
from novelforge_sessions import leases
from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.control.intents import approval_problem, current_state
from novelforge_sessions.control.fingerprints import fingerprint
from novelforge_sessions.control.service import Waited, waiting_for_sessions
from novelforge_sessions.control.resume import NOT_CONTINUED
from novelforge_sessions.control.waits import Repair
from novelforge_sessions.errors import CATALOG, page_message
from novelforge_sessions.phrases import joined, say
from novelforge_sessions.counting import count_up_to
from novelforge_sessions.control.models import (
    HANDOFF_FINISHED_AT,
    OPEN_STATES,
    Approval,
    ConsumeReceipt,
    DeliveryOutcome,
    Handoff,
    HandoffState,
    IntentKind,
    IntentState,
    ResultDelivery,
    WriteIntent,
)
from novelforge_sessions.models import (
    ArtifactVersion,
    Checkpoint,
    Event,
    Membership,
    Project,
    Run,
    RuntimeAttachment,
    Session,
)
from reviews.models import ReviewAssignment, ReviewGate, Verdict

S = rt.SessionStatus
STATES: list[str] = [s.value for s in S]

# ------------------------------------------------------------------------------------
# Words for people: every state readable in plain words, not only as a code
# ------------------------------------------------------------------------------------
#: What a manager reads for each session state: badges, counts, the state filter, the diagram,
#: the charts and the event feed. The one map: templates use the ``state_label`` filter
#: (``templatetags/dashboard_words``), and the live pages get it once in the page
#: (``{% dashboard_words %}``, read by static/js/dashboard.js as ``NF.stateLabel``). The code
#: itself stays in ``data-state`` and ``title`` attributes and in the filter's URLs.
#: The words are marked for translation and read in the request's language (docs/pages.md#language).
STATE_LABELS: dict[str, str] = {
    S.CREATED: _("created"),
    S.RUNNING: _("running"),
    S.IDLE: _("idle"),
    S.AWAITING_USER: _("waiting for a person"),
    S.AWAITING_EXTERNAL: _("waiting for a worker"),
    S.COMPLETED: _("completed"),
    S.FAILED: _("failed"),
    S.TERMINATED: _("terminated"),
    S.STALE: _("stale"),
}

#: Status and end reasons the service writes as codes (``actions/runtimes.py`` and
#: ``control/results.py``), said as sentences; ``{detail}`` is what follows ``<code>: `` (a
#: handoff's logical id). Every other reason is a person's or an agent's own words, shown as
#: written. Mirrored by ``NF.reasonText`` from the same map.
REASON_TEXT: dict[str, str] = {
    "runtime_lost": _("The runtime went away (closed, or it stopped answering)"),
    "conflicting_result": _("A different result arrived for handoff {detail} after one was consumed"),
    # reasons the service writes in words (actions/runs.py, control/graphs.py, control/handoffs.py,
    # control/resume.py, the manager's actions in dashboard/views.py): the same words, translated
    "run started": _("run started"),
    "graph thread deleted": _("graph thread deleted"),
    "external results bound": _("external results bound"),
    "superseded by resume": _("superseded by resume"),
    "closed by manager": _("closed by manager"),
    "abort requested by manager": _("abort requested by manager"),
    "terminated by manager": _("terminated by manager"),
    "resumed by manager": _("resumed by manager"),
}


#: Every event type of the catalog (``event_types.CATALOG``) in plain words, the one map: the
#: overview's "Last event" column and the event feeds say these; the code stays in ``title`` and
#: ``data-type`` attributes (``tests/dashboard/test_event_words.py`` checks none is missing).
EVENT_WORDS: dict[str, str] = {
    "session.created": _("session opened"),
    "session.transitioned": _("state changed"),
    "session.resumed": _("session resumed"),
    "session.forgotten": _("session forgotten"),
    "session.binding_invalidated": _("checkpoint binding invalidated"),
    "transcript.appended": _("transcript entry added"),
    "runtime.attached": _("runtime attached"),
    "runtime.closed": _("runtime closed"),
    "runtime.lost": _("runtime lost"),
    "run.started": _("run started"),
    "run.cursor_advanced": _("run moved on"),
    "run.ended": _("run ended"),
    "run.abort_requested": _("abort requested"),
    "checkpoint.recorded": _("checkpoint saved"),
    "graph.thread_copied": _("graph thread copied"),
    "graph.pruned": _("graph checkpoints pruned"),
    "graph.runs_deleted": _("graph runs deleted"),
    "artifact.created": _("artifact created"),
    "artifact.version_added": _("new artifact version"),
    "handoff.created": _("job handed off"),
    "handoff.claimed": _("job claimed by a worker"),
    "handoff.cancelled": _("handoff cancelled"),
    "handoff.result_consumed": _("worker's result used"),
    "handoff.result_invalid": _("worker's result refused"),
    "handoff.result_conflict": _("conflicting result"),
    "handoff.waiting_long": _("job waiting too long"),
    "handoff.conflict_resolved": _("conflict resolved"),
    "write_intent.created": _("write proposed"),
    "write_intent.approved": _("write approved"),
    "write_intent.rejected": _("write rejected"),
    "write_intent.approval_revoked": _("write approval revoked"),
    "write_intent.executed": _("write carried out"),
    "write_intent.refused": _("write refused"),
    "artifact.current_changed": _("current artifact version changed"),
    "authority.settled": _("authority settled"),
    "framework.changed": _("framework changed"),
    "review.gate_opened": _("review requested"),
    "review.packet_claimed": _("review packet claimed"),
    "review.verdict_bound": _("review verdict recorded"),
    "review.gate_completed": _("review finished"),
    "review.gate_cancelled": _("review withdrawn"),
}


#: The other records' state codes (runtimes, handoffs, write intents, review gates and assignments)
#: and the review decisions, as a page shows them: in English the code itself, in another language
#: its translation; the code stays in ``class``/``data-state``/``title`` attributes.
CODE_WORDS: dict[str, str] = {
    "live": _("live"), "closed": _("closed"), "lost": _("lost"),
    "pending": _("pending"), "claimed": _("claimed"), "bound": _("bound"), "conflicted": _("conflicted"),
    "cancelled": _("cancelled"), "complete": _("complete"), "open": _("open"), "assigned": _("assigned"),
    "submitted": _("submitted"), "proposed": _("proposed"), "approved": _("approved"), "rejected": _("rejected"),
    "executed": _("executed"), "refused": _("refused"), "pass": _("pass"), "revise": _("revise"), "reject": _("reject"),
    "completed": _("completed"), "failed": _("failed"), "aborted": _("aborted"), "interrupted": _("interrupted"),
    "terminated": _("terminated"),
}


def code_word(code: str | None) -> str:
    """A state code or decision in the page's language (an unknown code as it is)."""
    return str(CODE_WORDS.get(code or "", code or ""))


B = rt.CheckpointBoundary

#: The checkpoint boundaries (``session_runtime.CheckpointBoundary``, docs/model.md#checkpoints) as the
#: pages name them: the timeline's tick labels, the checkpoints panel and the checkpoint summaries. In
#: English the code's words, in another language their translation; the code stays in ``title`` and
#: ``data-boundary`` attributes. Mirrored by ``NF.boundaryWords`` from the same map.
BOUNDARY_WORDS: dict[str, str] = {
    B.CONTEXT_FREEZE: pgettext_lazy("checkpoint boundary", "context freeze"),
    B.CANDIDATE_FROZEN: pgettext_lazy("checkpoint boundary", "candidate frozen"),
    B.USER_WAIT: pgettext_lazy("checkpoint boundary", "user wait"),
    B.EXTERNAL_WAIT: pgettext_lazy("checkpoint boundary", "external wait"),
    B.BEFORE_CONSEQUENTIAL_WRITE: pgettext_lazy("checkpoint boundary", "before consequential write"),
    B.AFTER_EXTERNAL_RESULT: pgettext_lazy("checkpoint boundary", "after external result"),
    B.BEFORE_CANON_SETTLEMENT: pgettext_lazy("checkpoint boundary", "before canon settlement"),
    B.BEFORE_LONG_HANDOFF: pgettext_lazy("checkpoint boundary", "before long handoff"),
}


def _words_of(table: dict[str, str], code: str | None) -> str:
    """A code in the page's language from one of the word maps (an unknown one as its code, spaced)."""
    return str(table.get(code or "", (code or "").replace("_", " ")))


def boundary_words(code: str | None) -> str:
    """A checkpoint boundary in the page's language (an unknown one as its code, spaced)."""
    return _words_of(BOUNDARY_WORDS, code)


R = rt.SessionRole

#: A session's role (``session_runtime.SessionRole``, docs/model.md#roles-and-memory-policies) as the
#: pages name it: the overview's role column and filter, the session page's identity panel and the
#: ``session.created`` summaries. In English the code's words, in another language their translation;
#: the code stays in ``title``/``data-role`` attributes and in the filter's URLs. A role ``other``'s
#: extension name is the agent's own, shown as written. Mirrored by ``NF.roleWords`` from the same map.
ROLE_WORDS: dict[str, str] = {
    R.MANAGER: pgettext_lazy("session role", "manager"),
    R.WRITER: pgettext_lazy("session role", "writer"),
    R.SPECIALIST: pgettext_lazy("session role", "specialist"),
    R.SEMANTIC_REVIEWER: pgettext_lazy("session role", "semantic reviewer"),
    R.HUMAN_REVIEWER: pgettext_lazy("session role", "human reviewer"),
    R.OTHER: pgettext_lazy("session role", "other"),
}


def role_words(code: str | None) -> str:
    """A session's role in the page's language (an unknown one as its code, spaced)."""
    return _words_of(ROLE_WORDS, code)


#: A session's memory policy (``session_runtime.MemoryPolicy``, docs/model.md#roles-and-memory-policies) as
#: the identity panel says it: what its runtime may retain between invocations, in plain words. The
#: code stays in the ``data-memory-policy``/``title`` attributes.
MEMORY_POLICY_WORDS: dict[str, str] = {
    rt.MemoryPolicy.NONE: pgettext_lazy("memory policy", "keeps nothing between invocations"),
    rt.MemoryPolicy.BOUNDED: pgettext_lazy("memory policy", "keeps a bounded memory"),
    rt.MemoryPolicy.SESSION: pgettext_lazy("memory policy", "keeps the whole session"),
    rt.MemoryPolicy.EXTERNAL: pgettext_lazy("memory policy", "keeps memory in an outside store"),
    rt.MemoryPolicy.CHECKPOINT_ONLY: pgettext_lazy("memory policy", "keeps only its checkpoints"),
}


def memory_policy_words(code: str | None) -> str:
    """A session's memory policy in the page's language (an unknown one as its code, spaced)."""
    return _words_of(MEMORY_POLICY_WORDS, code)


_WAIT_GATE = re.compile(r"^review gate #(\d+) \((\w+) route\)$")
_WAIT_HANDOFF = re.compile(r"^handoff (.+) \((\w+)\)$")


def wait_words(label: str | None) -> str:
    """What a session waits on (the wait registry's labels: ``review gate #3 (page route)``,
    ``handoff chapter-2/check (claimed)``) in the page's language; any other label as it is."""
    text = label or ""
    if m := _WAIT_GATE.match(text):
        return _("review gate #%(id)s (%(route)s route)") % {"id": m.group(1), "route": m.group(2)}
    if m := _WAIT_HANDOFF.match(text):
        return _("handoff %(job)s (%(state)s)") % {"job": m.group(1), "state": code_word(m.group(2))}
    return text


#: Every catalogued refusal's words for a page (``errors.ServiceError.words``, marked there),
#: translated in the request's language: the API's message is English (its code stays the same
#: everywhere), so a page in another language says the code's sentence and shows the code beside it
#: (``error_words``), unless the message is a phrase of its own, said in the page's language.
ERROR_WORDS: dict[str, str] = {code: _(cls.words) for code, cls in CATALOG.items()}


def said(text: Any) -> str:
    """A text of the service in the page's language: a phrase (``phrases.Phrase``: a validator's
    message, a resume step's detail) said again through the catalogs; any other text as it is."""
    return say(text, gettext)


def error_words(code: str | None, message: str) -> str:
    """A refusal in the page's language: the API's own (English) message in English; in another
    language the message itself when it is a phrase, else the code's sentence (``errors.page_message``)."""
    return page_message(code, message, gettext, english=(get_language() or "en").startswith("en"))


#: The resume steps (``control/resume.py`` and the wait kinds', e.g. ``reviews``: docs/model.md#resume), as
#: the resume page names them: in English the step's code itself, in another language its translation.
STEP_WORDS: dict[str, str] = {
    "load": pgettext_lazy("resume step", "load"),
    "framework": pgettext_lazy("resume step", "framework"),
    "authority": pgettext_lazy("resume step", "authority"),
    "context": pgettext_lazy("resume step", "context"),
    "artifacts": pgettext_lazy("resume step", "artifacts"),
    "approvals": pgettext_lazy("resume step", "approvals"),
    "capabilities": pgettext_lazy("resume step", "capabilities"),
    "results": pgettext_lazy("resume step", "results"),
    "reviews": pgettext_lazy("resume step", "reviews"),
    "consumed": pgettext_lazy("resume step", "consumed"),
    "continue": pgettext_lazy("resume step", "continue"),
}

#: The repair routes a failed resume step names (``control.waits.Repair``, the codes docs/model.md#resume
#: uses), as the resume page says them: in English the code itself, in another language its translation.
REPAIR_WORDS: dict[str, str] = {
    Repair.REFREEZE: pgettext_lazy("repair route", "re-freeze"),
    Repair.REREVIEW: pgettext_lazy("repair route", "re-review"),
    Repair.REAPPROVE: pgettext_lazy("repair route", "re-approve"),
    Repair.TERMINATE_AS_STALE: pgettext_lazy("repair route", "terminate-as-stale"),
    Repair.ATTACH_CAPABLE_RUNTIME: pgettext_lazy("repair route", "attach-capable-runtime"),
    Repair.RESOLVE_CONFLICT: pgettext_lazy("repair route", "resolve-conflict"),
}


def step_words(code: str | None) -> str:
    """A resume step's name in the page's language (an unknown step as it is)."""
    return str(STEP_WORDS.get(code or "", code or ""))


def repair_words(routes: str | Iterable[str] | None) -> str:
    """A repair route, or several in a row ("re-freeze, re-approve"), in the page's language."""
    if routes is None or isinstance(routes, str):
        return str(REPAIR_WORDS.get(routes or "", routes or ""))
    return said(joined([repair_words(r) for r in routes]))


def resume_report(report: dict[str, Any]) -> dict[str, Any]:
    """The resume report (``control/resume.py``) as the resume page shows it, in the page's language:
    each step's name (``STEP_WORDS``), its detail (a phrase, said again; a failed "continue" names the
    failed steps in words) and its repair route (``REPAIR_WORDS``). The codes stay in ``step`` and
    ``repair``; the report itself (the API's) is not changed."""
    steps = report.get("steps") or []
    failed = [s["step"] for s in steps if not s["ok"] and s["step"] != "continue"]
    shown = []
    for step in steps:
        detail = said(step.get("detail"))
        if step["step"] == "continue" and not step["ok"] and failed:
            detail = gettext(NOT_CONTINUED) % {"steps": said(joined([step_words(f) for f in failed]))}
        shown.append({**step, "name": step_words(step["step"]), "said": detail,
                      "repair_words": repair_words(step.get("repair"))})
    return {**report, "steps": shown, "repair_words": repair_words(report.get("repairs") or [])}


def event_words(event_type: str | None) -> str:
    """An event type in words (an unknown type as it is)."""
    return str(EVENT_WORDS.get(event_type or "", event_type or ""))


def state_label(state: str | None) -> str:
    """A session state in words (an unknown value as it is)."""
    return str(STATE_LABELS.get(state or "", state or ""))


@dataclass(frozen=True)
class Reason:
    """A status reason as a person reads it: ``text``, and whether it came from a code
    (``coded``: a sentence of ours) or is someone's free text (quoted as written)."""

    code: str
    text: str
    coded: bool


def reason(value: str | None) -> Reason:
    """``runtime_lost`` → its sentence; ``conflicting_result: <id>`` → its sentence naming the
    id; anything else (a code with a detail it does not take, free text) → as written."""
    raw = value or ""
    code, sep, detail = raw.partition(": ")
    template = REASON_TEXT.get(code)
    if template is None or ("{detail}" in template) != bool(sep and detail):
        for pattern, said in SERVICE_REASONS:
            if m := pattern.fullmatch(raw):
                return Reason(raw, str(said).replace("{1}", m.group(1)), False)
        return Reason(raw, raw, False)
    return Reason(raw, str(template).replace("{detail}", detail), True)


#: Reasons the service writes with an id in them (reviews/actions.py, control/handoffs.py): shown as
#: written in English, translated in another language (``{1}`` is the id). Mirrored by NF.reasonText.
SERVICE_REASONS: list[tuple[re.Pattern, str]] = [
    (re.compile(r"review gate (\d+) waits on a reviewer"), _("review gate {1} waits on a reviewer")),
    (re.compile(r"review gate (\d+) bound"), _("review gate {1} bound")),
    (re.compile(r"waiting on handoff (.+)"), _("waiting on handoff {1}")),
]


def reason_text(value: str | None) -> str:
    return reason(value).text


def words() -> dict[str, Any]:
    """The maps the live pages need (rendered once into the page as JSON)."""
    return {"states": {str(k): str(v) for k, v in STATE_LABELS.items()},
            "reasons": {k: str(v) for k, v in REASON_TEXT.items()},
            "patterns": [[p.pattern, str(said)] for p, said in SERVICE_REASONS],
            "events": {k: str(v) for k, v in EVENT_WORDS.items()},
            "codes": {k: str(v) for k, v in CODE_WORDS.items()},
            "boundaries": {str(k): str(v) for k, v in BOUNDARY_WORDS.items()},
            "roles": {str(k): str(v) for k, v in ROLE_WORDS.items()},
            "labels": {"details": str(_("details")), "event": str(_("event #{id}"))}}


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


#: A node's label wraps onto a second line past this many characters (13 px bold in NODE_W).
NODE_LINE_CHARS = 16


@dataclass
class DiagramNode:
    state: str
    x: int
    y: int
    classes: str
    visits: int

    @property
    def label(self) -> str:
        return state_label(self.state)

    @property
    def lines(self) -> list[str]:
        """The label in one line, or two split at the space nearest the middle."""
        text = self.label
        if len(text) <= NODE_LINE_CHARS or " " not in text:
            return [text]
        spaces = [i for i, c in enumerate(text) if c == " "]
        cut = min(spaces, key=lambda i: abs(i - len(text) / 2))
        return [text[:cut], text[cut + 1:]]

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
        Event.objects.filter(session_id__any=[session_id], type=ev.SESSION_TRANSITIONED.name)
        .order_by("-session_id", "-id").values_list("payload", flat=True)[:limit]
    )  # from the (session_id, type, id) index, however many checkpoints the session has
    pairs = [(p.get("from"), p.get("to")) for p in reversed(list(rows))]
    return [(a, b) for a, b in pairs if a in STATES and b in STATES]


def build_diagram(status: str, taken: Sequence[tuple[str, str]]) -> Diagram:
    current = S(status)
    allowed = lc.SESSION.table[current]
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
    for src, targets in lc.SESSION.table.items():
        for dst in sorted(targets, key=lambda s: STATES.index(s.value)):
            d, lx, ly = _edge_path(src, dst, src in lc.SESSION.table[dst])
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
# Run timeline: runs as bars, checkpoints as ticks, handoffs as spans, review gates as
# flags, runtime generations as spans of their own lane
# ------------------------------------------------------------------------------------
#: Handoff spans are packed into at most this many rows under their run's bar.
MAX_SPAN_ROWS = 4
SPAN_ROW_PX = 12
TRACK_PX = 30


#: Every bar and span is at least this wide (percent of the track; CSS adds a pixel floor), so a
#: sub-second handoff or run is visible on a day-long timeline.
MIN_SPAN_PCT = 1.0
MIN_BAR_PCT = 0.8
#: Checkpoint labels go into at most this many label lanes above the bar; a label that fits in
#: none is thinned (the tick stays, its tooltip names it). The server's placement assumes this
#: track width and character width; static/js/dashboard.js places them again from measured boxes.
LABEL_LANES = 2
_EST_TRACK_PX = 640.0
_EST_CHAR_PX = 5.6


@dataclass
class Tick:
    left: float
    label: str
    title: str
    checkpoint_id: int
    #: the boundary's code (the label and title say it in words)
    boundary: str = ""
    lane: int = 0
    thinned: bool = False
    #: the label would run past the track's end: it ends at its tick instead
    flip: bool = False


def _place_labels(ticks: list[Tick]) -> None:
    """Greedy lanes for tick labels (the Temporal timeline's rule: never draw two labels over
    each other): the first lane whose last label ends before this one starts, else thinned."""
    ends: list[float] = []
    for t in sorted(ticks, key=lambda x: (x.left, x.checkpoint_id)):
        width = (len(t.label) * _EST_CHAR_PX + 12) / _EST_TRACK_PX * 100
        start = t.left
        if t.left + width > 100.0:
            t.flip, start = True, t.left - width
        lane = next((i for i, end in enumerate(ends) if end <= start), None)
        if lane is None and len(ends) < LABEL_LANES:
            ends.append(0.0)
            lane = len(ends) - 1
        if lane is None:
            t.thinned = True
            continue
        t.lane = lane
        ends[lane] = start + width


@dataclass(frozen=True)
class LegendItem:
    """One legend entry: ``classes`` are exactly the classes of the element it explains, so its
    swatch is painted by the same CSS rule as the bars (the colours cannot drift apart)."""

    element: str
    classes: str
    label: str


@dataclass
class Span:
    """A handoff on its run's bar: created → bound (or cancelled, or now while waiting)."""

    left: float
    width: float
    row: int
    classes: str
    label: str
    title: str
    handoff_id: int
    lease_expires_at: datetime | None = None

    @property
    def top(self) -> int:
        return TRACK_PX - 1 + self.row * SPAN_ROW_PX


@dataclass
class Flag:
    """A review gate, planted where its run opened it."""

    left: float
    classes: str
    title: str
    gate_id: int
    state: str


@dataclass
class Bar:
    label: str
    left: float
    width: float
    classes: str
    title: str
    ticks: list[Tick] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    span_rows: int = 0
    hidden_spans: int = 0
    hidden_ticks: int = 0  # the run's earlier checkpoints, not drawn

    @property
    def track_height(self) -> int:
        return TRACK_PX + self.span_rows * SPAN_ROW_PX + (4 if self.span_rows else 0)

    @property
    def label_lanes(self) -> int:
        return max((t.lane + 1 for t in self.ticks if not t.thinned), default=0)


@dataclass
class Timeline:
    start: datetime
    end: datetime
    runs: list[Bar]
    runtimes: list[Bar]
    hidden_runs: int
    legend: list[LegendItem] = field(default_factory=list)

    @property
    def has_handoffs(self) -> bool:
        return any(b.spans for b in self.runs)

    @property
    def lasted(self) -> str:
        """How long the drawn span is, in words (the scale's ends alone read the same for a short session)."""
        return duration_text((self.end - self.start).total_seconds())

    @property
    def has_gates(self) -> bool:
        return any(b.flags for b in self.runs)


def duration_text(seconds: float) -> str:
    """A duration in words: "under a second", "42 seconds", "4 minutes", "3 hours"."""
    if seconds < 1:
        return str(_("under a second"))
    if seconds < 120:
        n = int(seconds)
        return ngettext("%(n)d second", "%(n)d seconds", n) % {"n": n}
    if seconds < 7200:
        n = int(seconds // 60)
        return ngettext("%(n)d minute", "%(n)d minutes", n) % {"n": n}
    n = int(seconds // 3600)
    return ngettext("%(n)d hour", "%(n)d hours", n) % {"n": n}


def _pct(t: datetime, t0: datetime, span: float) -> float:
    return max(0.0, min(100.0, (t - t0).total_seconds() / span * 100.0))


def handoff_end(h: Handoff) -> datetime | None:
    """When a handoff stopped waiting (None while it still waits)."""
    if h.state == HandoffState.CANCELLED:
        return h.cancelled_at
    if h.state == HandoffState.CONFLICTED:
        return h.conflict_at or h.bound_at
    return h.bound_at


def _pack_spans(bar: Bar, handoffs: list[Handoff], t0: datetime, span: float, now: datetime) -> None:
    """Greedy interval packing: each handoff goes into the first row where it fits."""
    row_ends: list[float] = []
    for h in sorted(handoffs, key=lambda x: (x.created_at, x.id)):
        left = _pct(h.created_at, t0, span)
        right = _pct(handoff_end(h) or now, t0, span)
        right = max(right, left + MIN_SPAN_PCT)  # a sub-second handoff is still visible
        if right > 100.0:
            left, right = max(0.0, 100.0 - MIN_SPAN_PCT), 100.0
        row = next((i for i, end in enumerate(row_ends) if end + 0.5 <= left), None)
        if row is None:
            if len(row_ends) >= MAX_SPAN_ROWS:
                bar.hidden_spans += 1
                continue
            row_ends.append(right)
            row = len(row_ends) - 1
        else:
            row_ends[row] = right
        lease = h.lease_expires_at if h.state == HandoffState.CLAIMED else None
        title = _("handoff %(job)s · %(state)s · attempt %(attempt)s") % {
            "job": h.logical_id, "state": code_word(h.state), "attempt": h.attempt}
        if lease is not None:
            title += " · " + _("lease held by %(holder)s until %(at)s UTC") % {
                "holder": h.lease_holder or "?", "at": f"{lease:%Y-%m-%d %H:%M:%S}"}
        title += " · " + _("created %(at)s UTC") % {"at": f"{h.created_at:%Y-%m-%d %H:%M:%S}"}
        end = handoff_end(h)
        if end:
            title += f" · {code_word(h.state)} {end:%Y-%m-%d %H:%M:%S} UTC"
        bar.spans.append(Span(left, right - left, row, f"hs-{h.state}", h.logical_id, title, h.id, lease))
    bar.span_rows = len(row_ends)


def build_timeline(session: Session, runs: list[Run], checkpoints: list[Checkpoint],
                   runtimes: list[RuntimeAttachment], hidden_runs: int, now: datetime | None = None,
                   handoffs: Sequence[Handoff] = (), gates: Sequence[ReviewGate] = ()) -> Timeline:
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
    handoffs_by_run: dict[int, list[Handoff]] = {}
    for h in handoffs:
        handoffs_by_run.setdefault(h.run_id, []).append(h)
    gates_by_run: dict[int, list[ReviewGate]] = {}
    for g in gates:
        gates_by_run.setdefault(g.run_id, []).append(g)
    run_bars = []
    for run in runs:
        left = _pct(run.started_at, t0, span)
        right = _pct(run.ended_at or now, t0, span)
        state = run.state + (" abort-requested" if run.abort_requested_at and run.state == rt.RunState.OPEN else "")
        left, width = _min_width(left, right, MIN_BAR_PCT)
        bar = Bar(
            label=_("run #%(seq)s") % {"seq": run.seq}, left=left, width=width, classes=f"run-{state}",
            title=_("run #%(seq)s · gen %(gen)s · %(mode)s · %(state)s") % {
                "seq": run.seq, "gen": run.generation, "mode": run.task_mode, "state": code_word(run.state)}
            + (f" ({reason_text(run.end_reason)})" if run.end_reason else ""),
        )
        drawn = by_run.get(run.id, [])
        bar.hidden_ticks = max(run.checkpoint_count - len(drawn), 0)
        for cp in sorted(drawn, key=lambda c: c.seq):
            words = boundary_words(cp.boundary)
            bar.ticks.append(Tick(_pct(cp.created_at, t0, span), words,
                                  _("checkpoint #%(seq)s · %(boundary)s") % {"seq": cp.seq, "boundary": words}
                                  + f" · {cp.created_at:%Y-%m-%d %H:%M:%S} UTC", cp.id, boundary=cp.boundary))
        _place_labels(bar.ticks)
        _pack_spans(bar, handoffs_by_run.get(run.id, []), t0, span, now)
        for g in sorted(gates_by_run.get(run.id, []), key=lambda x: x.id):
            outcome = " · " + _("outcome %(outcome)s") % {"outcome": code_word(g.outcome)} if g.outcome else ""
            bar.flags.append(Flag(
                _pct(g.created_at, t0, span), f"gate-{g.state}" + (f" dc-{g.outcome}" if g.outcome else ""),
                _("review gate #%(id)s · %(route)s route · %(state)s%(outcome)s · %(bound)s of %(n)s verdicts · "
                  "opened %(at)s UTC") % {"id": g.id, "route": g.route, "state": code_word(g.state), "outcome": outcome,
                                          "bound": g.bound_verdicts, "n": g.required_verdicts,
                                          "at": f"{g.created_at:%Y-%m-%d %H:%M:%S}"},
                g.id, g.state,
            ))
        run_bars.append(bar)
    runtime_bars = []
    for att in runtimes:
        expired = leases.runtime_lease_expired(att.state, att.lease_expires_at, now)
        left = _pct(att.attached_at, t0, span)
        # A lease that ran out ended the runtime then, whatever the record says yet.
        right = _pct(att.ended_at or (min(att.lease_expires_at, now) if expired else now), t0, span)
        left, width = _min_width(left, right, MIN_BAR_PCT)
        runtime_bars.append(Bar(
            label=_("gen %(gen)s") % {"gen": att.generation}, left=left, width=width,
            classes="rt-lost lease-expired" if expired else f"rt-{att.state}",
            title=_("generation %(gen)s") % {"gen": att.generation}
            + f" · {att.runtime_family} · {_('lease expired') if expired else code_word(att.state)}"
            + (f" ({reason_text(att.end_reason)})" if att.end_reason else ""),
        ))
    return Timeline(t0, t1, run_bars, runtime_bars, hidden_runs, _legend(run_bars, runtime_bars))


def _min_width(left: float, right: float, minimum: float) -> tuple[float, float]:
    """(left, width) with at least ``minimum`` percent, kept inside the track."""
    width = max(right - left, minimum)
    if left + width > 100.0:
        left = max(0.0, 100.0 - width)
    return left, width


_RUN_WORDS = {"open": _("open run"), "abort-requested": _("abort requested")}


def _legend(runs: list[Bar], runtimes: list[Bar]) -> list[LegendItem]:
    """The legend of what is drawn: one entry per distinct class of bar, span, tick and flag,
    carrying exactly that element's classes (see ``LegendItem``)."""
    items: list[LegendItem] = []
    seen: set[tuple[str, str]] = set()

    def add(element: str, classes: str, label: str) -> None:
        if (element, classes) not in seen:
            seen.add((element, classes))
            items.append(LegendItem(element, classes, label))

    for b in runs:
        state = b.classes.removeprefix("run-")
        words = _RUN_WORDS.get(state)
        if words is None:
            code, _sep, abort = state.partition(" ")
            words = _("run %(state)s") % {"state": code_word(code)} + (", " + str(_("abort requested")) if abort else "")
        add("tl-bar", b.classes, str(words))
    if any(b.ticks for b in runs):
        add("tl-tick", "", str(_("checkpoint")))
    for b in runs:
        for sp in b.spans:
            add("tl-span", sp.classes, _("handoff %(state)s") % {"state": code_word(sp.classes.removeprefix("hs-"))})
        for f in b.flags:
            gate_state, _sep, outcome = f.classes.removeprefix("gate-").partition(" dc-")
            words = code_word(gate_state) + (f", {code_word(outcome)}" if outcome else "")
            add("tl-flag", f.classes, _("review gate %(state)s") % {"state": words})
    for b in runtimes:
        label = (_("runtime lease expired") if "lease-expired" in b.classes
                 else _("runtime %(state)s") % {"state": code_word(b.classes.removeprefix("rt-"))})
        add("tl-bar", b.classes, str(label))
    return items


def compact_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "), default=str)


def pretty_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, indent=2, default=str)


# ------------------------------------------------------------------------------------
# Events and session rows
# ------------------------------------------------------------------------------------
def technical_key(key: str) -> bool:
    """Payload keys for engineers (ids, fingerprints, hashes): shown under "details", never in
    the summary line (mirrored by ``NF.technicalKey``)."""
    return key == "id" or key.endswith(("_id", "fingerprint", "_hash"))


def _scalar_items(payload: dict[str, Any], *, technical: bool = False) -> str:
    parts = []
    for key, value in payload.items():
        if technical_key(key) != technical:
            continue
        if isinstance(value, (str, int, float, bool)) and value != "":
            parts.append(f"{key}={value}")
    text = " · ".join(parts)
    return text if len(text) <= 120 else text[:119] + "…"


#: Stored type names of the catalog events ``describe`` words specially (compared by equality).
_AUTHORITY_HISTORY_NAMES = tuple(e.name for e in ev.AUTHORITY_HISTORY)
_EVENTS = Event._meta.db_table


def describe(event_type: str, payload: dict[str, Any]) -> str:
    """A one-line summary of an event for the feeds (mirrored by static/js/dashboard.js).

    ``event_type`` is the stored name; it is compared with the catalog constants' names and
    grouped by ``event_types.family_of``, never matched by prefix."""
    p = payload or {}
    family = ev.family_of(event_type)
    if event_type == ev.SESSION_TRANSITIONED.name:
        text = f"{state_label(p.get('from'))} → {state_label(p.get('to'))}"
        return text + _why(p)
    if event_type == ev.SESSION_CREATED.name:
        # the role in words; the task mode and the runtime family are the agent's own names, as written
        return f"{role_words(p.get('role'))} · {p.get('task_mode')} · {p.get('runtime_family')}"
    if event_type == ev.RUN_STARTED.name:
        return _("run #%(seq)s started · gen %(gen)s") % {"seq": p.get("seq"), "gen": p.get("generation")}
    if event_type == ev.RUN_ENDED.name:
        return _("run #%(seq)s %(state)s") % {"seq": p.get("seq"), "state": code_word(p.get("state"))} + _why(p)
    if event_type == ev.CHECKPOINT_RECORDED.name:
        return _("checkpoint #%(seq)s · %(boundary)s") % {"seq": p.get("seq"), "boundary": boundary_words(p.get("boundary"))}
    if event_type == ev.SESSION_RESUMED.name:
        return _describe_resumed(p)
    if family == ev.RUNTIME_ATTACHED.family:
        return _("generation %(gen)s") % {"gen": p.get("generation", "?")} + _why(p)
    if family == ev.HANDOFF_CREATED.family:
        return _describe_handoff(ev.CATALOG[event_type], p)
    if family == ev.REVIEW_GATE_OPENED.family:
        return _describe_review(ev.CATALOG[event_type], p)
    if family == ev.WRITE_INTENT_CREATED.family:
        action = _action(ev.CATALOG[event_type])
        what = _WRITE_ACTIONS.get(action, action.replace("_", " "))
        return (_("write intent #%(id)s %(what)s") % {"id": p.get("intent_id"), "what": what}
                + (f" · {p['kind']}" if p.get("kind") else ""))
    if event_type in _AUTHORITY_HISTORY_NAMES:
        return _describe_authority(event_type, p)
    return _scalar_items(p)


#: What happened to a write intent, in the summary's words (mirrored by static/js/dashboard.js).
_WRITE_ACTIONS = {"created": _("created"), "approved": _("approved"), "rejected": _("rejected"),
                  "approval_revoked": _("approval revoked"), "executed": _("executed"), "refused": _("refused")}


def _why(p: dict[str, Any]) -> str:
    """`` · <reason>`` in words (``reason_text``), or nothing."""
    value = p.get("reason")
    return f" · {reason_text(value)}" if isinstance(value, str) and value else ""


def _carried_over(carried: Any) -> list[str]:
    """What a resume handed to its new run (``session.resumed``'s ``carried_over``: a wait kind's pending
    key → its items), counted in words: unfinished handoffs, then open review gates, then any other kind's
    items together (mirrored by static/js/dashboard.js)."""
    counts = {key: len(items) for key, items in carried.items() if isinstance(items, list)} if isinstance(carried, dict) else {}
    said = []
    if n := counts.pop("handoffs", 0):
        said.append(ngettext("%(n)s unfinished handoff carried over", "%(n)s unfinished handoffs carried over", n) % {"n": n})
    if n := counts.pop("gates", 0):
        said.append(ngettext("%(n)s open review gate carried over", "%(n)s open review gates carried over", n) % {"n": n})
    if n := sum(counts.values()):
        said.append(ngettext("%(n)s other wait carried over", "%(n)s other waits carried over", n) % {"n": n})
    return said


def _describe_resumed(p: dict[str, Any]) -> str:
    """``session.resumed``: the runtime generation the new run is on, whether it starts over (no
    checkpoint), what it carried over, and why (``reason_text``)."""
    gen = p.get("generation")
    parts = [_("resumed on generation %(gen)s") % {"gen": "?" if gen is None else gen}]
    if p.get("checkpoint_id") is None:
        parts.append(str(_("no checkpoint: starts from the beginning")))
    return " · ".join(parts + _carried_over(p.get("carried_over"))) + _why(p)


def _action(event: ev.EventType) -> str:
    """What happened, the part of the name after its family (``claimed`` of ``handoff.claimed``)."""
    return event.name[len(event.family) + 1:]


def _describe_authority(event_type: str, p: dict[str, Any]) -> str:
    before, after = p.get("before") or {}, p.get("after") or {}
    if event_type == ev.FRAMEWORK_CHANGED.name:
        text = _("framework %(before)s → %(after)s") % {"before": before.get("framework_version"),
                                                       "after": after.get("framework_version")}
    else:
        text = _("authority v%(before)s → v%(after)s") % {"before": before.get("authority_version"),
                                                          "after": after.get("authority_version")}
        lock = after.get("lock_fingerprint")
        if isinstance(lock, str):
            text += " · " + _("lock %(lock)s…") % {"lock": lock[:15]}
    return text + (" · " + _("write intent #%(id)s") % {"id": p["intent_id"]} if p.get("intent_id") else "")


def authority_history(project: Project, *, limit: int = 20) -> list[EventView]:
    """The project's authority history, newest first: the events of exactly the types that
    change it (a settle, a framework change; ``event_types.AUTHORITY_HISTORY``)."""
    rows = Event.objects.raw(  # newest of each type from (project_id, type, id), merged
        f"SELECT e.* FROM unnest(%s::text[]) AS t(name) CROSS JOIN LATERAL "
        f"(SELECT * FROM {_EVENTS} WHERE project_id = ANY(%s::bigint[]) AND type = t.name "
        "ORDER BY project_id DESC, id DESC LIMIT %s) AS e ORDER BY e.id DESC LIMIT %s",
        [list(_AUTHORITY_HISTORY_NAMES), [project.id], limit, limit],
    )
    return event_views(rows)


def _describe_handoff(event: ev.EventType, p: dict[str, Any]) -> str:
    job = {"job": p.get("logical_id")}
    if event is ev.HANDOFF_CREATED:
        caps = p.get("required_capabilities") or []
        return _("handoff %(job)s created") % job + (
            " · " + _("needs %(caps)s") % {"caps": ", ".join(map(str, caps))} if caps else "")
    if event is ev.HANDOFF_CLAIMED:
        text = _("handoff %(job)s claimed by %(worker)s · attempt %(attempt)s") % {
            **job, "worker": p.get("worker"), "attempt": p.get("attempt")}
        return text + (" · " + _("previous lease expired") if p.get("reclaimed_after_expiry") else "")
    if event is ev.HANDOFF_RESULT_CONSUMED:
        return _("handoff %(job)s · result consumed") % job
    if event is ev.HANDOFF_RESULT_INVALID:
        return _("handoff %(job)s · invalid result refused") % job
    if event is ev.HANDOFF_RESULT_CONFLICT:
        return _("handoff %(job)s · CONFLICTING result: hard stop") % job
    if event is ev.HANDOFF_CONFLICT_RESOLVED:
        return _("handoff %(job)s · conflict resolved") % job
    if event is ev.HANDOFF_WAITING_LONG:
        return _("handoff %(job)s · waiting for %(minutes)s min") % {**job, "minutes": int(p.get("waited_seconds") or 0) // 60}
    if event is ev.HANDOFF_CANCELLED:
        return _("handoff %(job)s cancelled") % job + _why(p)
    return _("handoff %(job)s") % job + f" · {_action(event).replace('_', ' ')}"


def _describe_review(event: ev.EventType, p: dict[str, Any]) -> str:
    gate = {"gate": p.get("gate_id")}
    if event is ev.REVIEW_GATE_OPENED:
        return _("review gate #%(gate)s opened · %(route)s route · %(n)s verdict(s) needed") % {
            **gate, "route": p.get("route"), "n": p.get("required_verdicts")}
    if event is ev.REVIEW_VERDICT_BOUND:
        return _("review gate #%(gate)s · verdict bound (%(bound)s of %(n)s)") % {
            **gate, "bound": p.get("bound_verdicts"), "n": p.get("required_verdicts")}
    if event is ev.REVIEW_PACKET_CLAIMED:
        return _("review gate #%(gate)s · packet #%(packet)s claimed") % {**gate, "packet": p.get("packet_id")}
    action = _action(event).replace("gate_", "")
    return _("review gate #%(gate)s") % gate + f" · {_GATE_ACTIONS.get(action, action.replace('_', ' '))}"


#: A review gate's end in the summary's words (mirrored by static/js/dashboard.js).
_GATE_ACTIONS = {"completed": _("completed"), "cancelled": _("cancelled")}


@dataclass
class EventView:
    id: int
    type: str
    session_id: int | None
    project_id: int
    summary: str
    created_at: datetime
    to_state: str | None
    details: str = ""  # ids and fingerprints of the payload, for the "details" disclosure

    @property
    def words(self) -> str:
        return event_words(self.type)


def event_views(rows: Iterable[Event]) -> list[EventView]:
    out = []
    for e in rows:
        to_state = e.payload.get("to") if e.type == ev.SESSION_TRANSITIONED.name else None
        out.append(EventView(e.id, e.type, e.session_id, e.project_id, describe(e.type, e.payload), e.created_at,
                             to_state if to_state in STATES else None, _scalar_items(e.payload or {}, technical=True)))
    return out


@dataclass
class WaitingFor:
    """What an ``awaiting_*`` session waits on (the control plane's wait registry) and since when.
    ``question``: waiting on a person with nothing registered (its status reason says what)."""

    items: list[Waited]
    since: datetime | None
    question: str = ""

    @property
    def first_since(self) -> datetime | None:
        """Since when the longest wait has lasted (the oldest item, else entering the state)."""
        times = [i.since for i in self.items]
        return min(times) if times else self.since


@dataclass
class SessionRow:
    session: Session
    runtime: RuntimeAttachment | None
    last_event: Event | None
    waiting: WaitingFor | None = None

    @property
    def runtime_problem(self) -> bool:
        """A lost runtime, or one still marked live whose lease has run out."""
        att = self.runtime
        if att is None:
            return False
        return leases.runtime_problem(att.state, att.lease_expires_at, timezone.now())

    @property
    def stands_out(self) -> bool:
        return lc.needs_attention(
            self.session.status, open_conflict=self.session.open_conflict, runtime_problem=self.runtime_problem,
        )


def session_rows(sessions: list[Session]) -> list[SessionRow]:
    """Each session with its latest runtime attachment and last event (3 indexed queries)."""
    ids = [s.id for s in sessions]
    if not ids:
        return []
    latest: dict[int, RuntimeAttachment] = {
        a.session_id: a
        for a in RuntimeAttachment.objects.filter(session_id__in=ids).order_by("session_id", "-generation").distinct("session_id")
    }
    last_events = {e.session_id: e for e in last_event_per_session(ids)}
    waiting = waiting_for([s for s in sessions if lc.awaiting(s.status)])
    return [SessionRow(s, latest.get(s.id), last_events.get(s.id), waiting.get(s.id)) for s in sessions]


def waiting_for(sessions: list[Session]) -> dict[int, WaitingFor]:
    """What each awaiting session waits on (``control.service.waiting_for_sessions``: one query
    per wait kind) and since when it waits (its last ``session.transitioned`` event: one query)."""
    ids = [s.id for s in sessions]
    if not ids:
        return {}
    items = waiting_for_sessions(ids)
    entered = {e.session_id: e.created_at for e in last_event_per_session(ids, of_type=ev.SESSION_TRANSITIONED.name)}
    out = {}
    for s in sessions:
        found = items.get(s.id, [])
        question = ""
        if not found and s.status == S.AWAITING_USER:
            question = s.status_reason or "a person's answer"
        out[s.id] = WaitingFor(found, entered.get(s.id), question)
    return out


def last_event_per_session(session_ids: Sequence[int], *, of_type: str | None = None) -> list[Event]:
    """Each session's newest event (of one type, when ``of_type`` is given), as a lateral top-1:
    one backward probe of the (session_id, id) or (session_id, type, id) index per session, so the
    cost does not grow with the sessions' events (a ``GROUP BY … max(id)`` reads every event of
    every session on the page). ``= ANY(ARRAY[…])`` and the index's column order keep the planner
    off the primary key: ``models.AnyId``."""
    if of_type is None:
        return list(Event.objects.raw(
            f"SELECT e.* FROM unnest(%s::bigint[]) AS s(id) CROSS JOIN LATERAL "
            f"(SELECT * FROM {_EVENTS} WHERE session_id = ANY(ARRAY[s.id]) ORDER BY session_id DESC, id DESC LIMIT 1) AS e",
            [list(session_ids)],
        ))
    return list(Event.objects.raw(
        f"SELECT e.* FROM unnest(%s::bigint[]) AS s(id) CROSS JOIN LATERAL "
        f"(SELECT * FROM {_EVENTS} WHERE session_id = ANY(ARRAY[s.id]) AND type = %s "
        f"ORDER BY session_id DESC, type DESC, id DESC LIMIT 1) AS e",
        [list(session_ids), of_type],
    ))


def session_feed(session_id: int, limit: int) -> list[Event]:
    """The session's newest events, newest first, from its (session_id, id) index."""
    return list(Event.objects.filter(session_id__any=[session_id]).order_by("-session_id", "-id")[:limit])


def newest_events(project_ids: Iterable[int], limit: int) -> list[Event]:
    """The newest ``limit`` events of these projects, newest first: the top ``limit`` of each
    project from its (project_id, id) index, merged (flat in the number of events; an
    ``IN (…) ORDER BY id DESC`` over several projects sorts all their events)."""
    return list(Event.objects.raw(
        f"SELECT e.* FROM unnest(%s::bigint[]) AS p(id) CROSS JOIN LATERAL "
        f"(SELECT * FROM {_EVENTS} WHERE project_id = ANY(ARRAY[p.id]) ORDER BY project_id DESC, id DESC LIMIT %s) AS e "
        "ORDER BY e.id DESC LIMIT %s",
        [sorted(project_ids), limit, limit],
    ))


# ------------------------------------------------------------------------------------
# Handoffs of one session (the session page's "Pending handoffs" panel)
# ------------------------------------------------------------------------------------
OPEN_HANDOFFS_SHOWN = 50
FINISHED_HANDOFFS_SHOWN = 10

#: Still needs attention: waiting for a worker or a result (``lifecycles.handoff_waiting``), or a
#: conflict nobody resolved yet (``lifecycles.conflict_open``: resolving moves it back to bound).
OPEN_HANDOFF_Q = Q(state__in=OPEN_STATES)  # one IN: the ``handoff_session_open`` index's own condition


@dataclass
class HandoffRow:
    handoff: Handoff
    now: datetime

    @property
    def is_claimed(self) -> bool:
        """Its current claim's lease fields describe a claim (held or run out)."""
        return self.handoff.state == HandoffState.CLAIMED

    @property
    def lease_live(self) -> bool:
        h = self.handoff
        return leases.handoff_lease_held(h.state, h.lease_expires_at, self.now)

    @property
    def lease_expired(self) -> bool:
        """Claimed, but the lease ran out: the job is claimable again."""
        h = self.handoff
        return leases.handoff_lease_expired(h.state, h.lease_expires_at, self.now)

    @property
    def finished_at(self) -> datetime | None:
        return handoff_end(self.handoff)

    @property
    def state_note(self) -> str:
        """Where the handoff stands, in the page's language (the manager's resolution as written)."""
        h = self.handoff
        if h.state == HandoffState.PENDING:
            return str(_("waiting for a worker") if h.attempt == 0 else _("waiting for a worker again"))
        if h.state == HandoffState.CLAIMED:
            return str(_("a worker holds the lease") if self.lease_live else _("lease expired: claimable again"))
        if h.state == HandoffState.CONFLICTED:
            return str(_("a different result arrived after one was consumed: a manager must resolve it"))
        if h.state == HandoffState.BOUND:
            if h.conflict_resolution:
                return str(_("result consumed; conflict resolved (%(how)s)") % {"how": h.conflict_resolution})
            return str(_("result consumed"))
        return str(_("cancelled"))


@dataclass
class SessionHandoffs:
    open: list[HandoffRow]
    open_total: int
    finished: list[HandoffRow]
    finished_total: int


def session_handoffs(session_id: int, now: datetime | None = None) -> SessionHandoffs:
    """The handoffs of a session that still wait (oldest first), and the latest finished
    ones (most recently finished first: the ``handoff_session_finished`` index, in that order).
    Four indexed queries, whatever the counts."""
    now = now or timezone.now()
    base = Handoff.objects.filter(session_id=session_id).defer("inputs", "params", "result_schema")
    open_qs = base.filter(OPEN_HANDOFF_Q)
    finished_qs = base.exclude(OPEN_HANDOFF_Q).annotate(done_at=HANDOFF_FINISHED_AT)
    open_rows = list(open_qs.order_by("id")[:OPEN_HANDOFFS_SHOWN])
    finished = list(finished_qs.order_by("-done_at", "-id")[:FINISHED_HANDOFFS_SHOWN])
    # Counted up to COUNT_CAP (the page says "1000+" beyond): a session may hold half a million.
    open_total = len(open_rows) if len(open_rows) < OPEN_HANDOFFS_SHOWN else count_up_to(open_qs)
    finished_total = (len(finished) if len(finished) < FINISHED_HANDOFFS_SHOWN
                      else count_up_to(finished_qs, order=("-done_at", "-id")))
    return SessionHandoffs(
        [HandoffRow(h, now) for h in open_rows], open_total, [HandoffRow(h, now) for h in finished], finished_total,
    )


# ------------------------------------------------------------------------------------
# Open conflicts of one session (the session page's "Conflicting result" panel)
# ------------------------------------------------------------------------------------
OPEN_CONFLICTS_SHOWN = 10


@dataclass
class ConflictView:
    """A handoff whose result was consumed and then a *different* result arrived: the two side by side."""

    handoff: Handoff
    consumed: ConsumeReceipt | None
    conflicting: ResultDelivery | None

    @property
    def consumed_json(self) -> str:
        return pretty_json(self.consumed.result) if self.consumed else ""

    @property
    def conflicting_json(self) -> str:
        return pretty_json(self.conflicting.payload) if self.conflicting and self.conflicting.payload is not None else ""


def open_conflicts(session_id: int) -> list[ConflictView]:
    """The session's conflicted handoffs (``lifecycles.conflict_open``), oldest first, each with
    its consume receipt and the latest conflicting arrival. Three queries whatever the counts."""
    rows = list(
        Handoff.objects.filter(session_id=session_id, state=HandoffState.CONFLICTED)
        .defer("inputs", "params", "result_schema").order_by("id")[:OPEN_CONFLICTS_SHOWN]
    )
    if not rows:
        return []
    ids = [h.id for h in rows]
    receipts = {r.handoff_id: r for r in ConsumeReceipt.objects.filter(handoff_id__in=ids)}
    latest: dict[int, ResultDelivery] = {}
    for d in (ResultDelivery.objects.filter(handoff_id__in=ids, outcome=DeliveryOutcome.CONFLICTING_RESULT)
              .order_by("handoff_id", "-id").distinct("handoff_id")):
        latest[d.handoff_id] = d
    return [ConflictView(h, receipts.get(h.id), latest.get(h.id)) for h in rows]


# ------------------------------------------------------------------------------------
# Write intents of one project (the project page's approval queue)
# ------------------------------------------------------------------------------------
OPEN_INTENTS_SHOWN = 50
CLOSED_INTENTS_SHOWN = 20

_PROBLEM_TEXT = {
    "missing": "needs an approval",
    "rejected": "refused",
    "before_state_changed": "the approval is stale: the before-state changed",
    "authority_changed": "the approval is stale: the project's authority moved since it was given",
}


@dataclass
class IntentRow:
    intent: WriteIntent
    target: str
    approval: Approval | None
    #: why the standing approval does not authorise the write (None: it does)
    problem: str | None
    #: the before-state the intent names is no longer the current one: approving is refused
    stale: bool
    requires_approval: bool

    @property
    def needs_approval(self) -> bool:
        """Open, and no standing approval authorises it (a stale one does not count)."""
        return lc.intent_open(self.intent.state) and self.problem is not None

    @property
    def can_approve(self) -> bool:
        # A stale before-state cannot be approved (the action refuses it): the agent must
        # read the before-state again and create a new intent.
        return self.needs_approval and not self.stale

    @property
    def can_refuse(self) -> bool:
        return lc.intent_open(self.intent.state)

    @property
    def executed(self) -> bool:
        return self.intent.state == IntentState.EXECUTED

    @property
    def refused(self) -> bool:
        """Its compare-and-swap found a stale before-state (not a manager's rejection)."""
        return self.intent.state == IntentState.REFUSED

    @property
    def problem_text(self) -> str:
        return _PROBLEM_TEXT.get(self.problem or "", "")



@dataclass
class ProjectIntents:
    open: list[IntentRow]
    open_total: int
    closed: list[IntentRow]
    closed_total: int
    awaiting: int = 0  # of the open ones: still waiting for an approval
    approved: int = 0  # of the open ones: approved, waiting for the agent to execute them


def _intent_target(intent: WriteIntent, numbers: dict[int, int]) -> str:
    params, before = intent.params or {}, intent.before_state or {}
    if intent.kind == IntentKind.ARTIFACT_MAKE_CURRENT:
        name = intent.artifact.name if intent.artifact else f"artifact {intent.artifact_id}"
        wanted = numbers.get(params.get("version_id"), "?")
        was = numbers.get(before.get("current_version_id"))
        return f"{name}: make v{wanted} current" + (f" (was v{was})" if was else "")
    if intent.kind == IntentKind.AUTHORITY_SETTLE:
        n = len(params.get("artifacts") or [])
        version = before.get("authority_version")
        nxt = f" as authority v{version + 1}" if isinstance(version, int) else ""
        return f"settle {n} artifact version{'s' if n != 1 else ''}{nxt}"
    if intent.kind == IntentKind.FRAMEWORK_CHANGE:
        return f"framework {before.get('framework_version')} → {params.get('framework_version')}"
    return intent.kind


def _intent_rows(project: Project, intents: list[WriteIntent]) -> list[IntentRow]:
    version_ids = set()
    for i in intents:
        if isinstance((i.params or {}).get("version_id"), int):
            version_ids.add(i.params["version_id"])
        if isinstance((i.before_state or {}).get("current_version_id"), int):
            version_ids.add(i.before_state["current_version_id"])
    numbers = dict(ArtifactVersion.objects.filter(id__in=version_ids).values_list("id", "number")) if version_ids else {}
    rows = []
    for i in intents:
        approval = i.standing[0] if i.standing else None
        problem = approval_problem(i, approval, project)
        stale = False
        if lc.intent_open(i.state):
            # The same before-state the approval action compares (read from the preloaded rows).
            stale = fingerprint(current_state(project, i.kind, i.artifact)) != i.before_fingerprint
        rows.append(IntentRow(i, _intent_target(i, numbers), approval, problem, stale, project.requires_write_approval))
    return rows


def project_intents(project: Project) -> ProjectIntents:
    """Open intents (proposed or approved, oldest first) and the latest closed ones.
    A fixed number of queries whatever the counts."""
    base = (
        WriteIntent.objects.filter(project=project).select_related("artifact__current_version")
        .prefetch_related(Prefetch("approvals", queryset=Approval.objects.filter(revoked_at__isnull=True), to_attr="standing"))
    )
    open_states = tuple(s for s in IntentState if lc.intent_open(s))
    open_intents = list(base.filter(state__in=open_states).order_by("id")[:OPEN_INTENTS_SHOWN])
    closed = list(base.exclude(state__in=open_states).order_by("-id")[:CLOSED_INTENTS_SHOWN])
    counts = {
        row["state"]: row["n"]
        for row in WriteIntent.objects.filter(project=project).values("state").annotate(n=Count("id")).order_by()
    }
    open_total = sum(counts.get(s, 0) for s in open_states)
    return ProjectIntents(
        _intent_rows(project, open_intents), open_total, _intent_rows(project, closed), sum(counts.values()) - open_total,
        awaiting=counts.get(IntentState.PROPOSED, 0), approved=counts.get(IntentState.APPROVED, 0),
    )


def project_reviews(project: Project) -> dict[str, int]:
    """How much review work the calibration view has to go on in this project."""
    gates = ReviewGate.objects.filter(project=project).aggregate(
        total=Count("id"), pending=Count("id", filter=Q(state=ReviewGate.State.PENDING)),
    )
    verdicts = Verdict.objects.filter(packet__gate__project=project).aggregate(n=Count("id"))
    # Everyone asked to review in this project (an assigned slot or a verdict), not only those
    # who already answered.
    reviewers = (ReviewAssignment.objects.filter(packet__gate__project=project).exclude(reviewer="")
                 .aggregate(n=Count("reviewer", distinct=True)))
    return {"gates": gates["total"], "pending": gates["pending"], "verdicts": verdicts["n"], "reviewers": reviewers["n"]}


# ------------------------------------------------------------------------------------
# Top navigation
# ------------------------------------------------------------------------------------
def nav_roles(user: Any) -> dict[str, bool]:
    """Which top-nav links a user gets: the same ``is_manager`` flag the reviewer pages use,
    and ``is_reviewer`` for the "Reviews" link. One query."""
    if not getattr(user, "is_authenticated", False):
        return {"is_manager": False, "is_reviewer": False}
    roles = set(Membership.objects.filter(user=user).values_list("role", flat=True).distinct())
    return {"is_manager": Membership.Role.MANAGER in roles, "is_reviewer": Membership.Role.REVIEWER in roles}
