"""No state name is written as a literal outside the pure core (docs/model.md#record-lifecycles).

Every lifecycle is declared once in ``novelforge_sessions/lifecycles.py`` (and the contract's
session table in ``session_runtime.py``). Everywhere else — actions, SQL, models, API schemas,
presenters, templates, scripts — state values come from the enums (SQL takes them as
parameters), so renaming or adding a state is one edit and the tables are the only truth.

The scan looks for a state name in a *state context*: compared with or assigned to a
``state``/``status`` (Python, SQL, templates, JavaScript), inside ``state__in``/``status__in``
lists, ``Literal[...]`` types, and SQL ``IN (...)`` lists. Words such as "pending" used as a
dict key or in prose are not states and are not flagged.
"""
from __future__ import annotations

import re
from pathlib import Path

from novelforge_sessions import lifecycles as lc

ROOT = Path(__file__).resolve().parent.parent
CORE = {ROOT / "novelforge_sessions" / "lifecycles.py", ROOT / "novelforge_sessions" / "session_runtime.py"}
STATES = sorted({v for lifecycle in lc.ALL for v in lifecycle.values()}, key=len, reverse=True)
NAME = "(?:" + "|".join(STATES) + ")"
Q = r"""['"]"""

PATTERNS = [
    # Python / JS / templates: state == "x", status != 'x', state="x" (kwargs), state: "x"
    re.compile(rf"""\b\w*(?:state|status)\w*\s*(?:===?|!==?|=|:)\s*{Q}{NAME}{Q}""", re.I),
    re.compile(rf"""{Q}{NAME}{Q}\s*(?:===?|!==?)\s*[\w.]*(?:state|status)""", re.I),
    # SQL: state = 'x', s.status <> 'x', SET state = 'x'
    re.compile(rf"""\b(?:state|status)\s*(?:=|<>|!=)\s*'{NAME}'""", re.I),
    # SQL IN lists and Django __in lists / Literal[...] types naming states
    re.compile(rf"""\b(?:state|status)\s+(?:NOT\s+)?IN\s*\(\s*'{NAME}'""", re.I),
    re.compile(rf"""(?:state|status)__in\s*=\s*[\[(]\s*{Q}{NAME}{Q}"""),
    re.compile(rf"""Literal\[\s*{Q}{NAME}{Q}"""),
]
SUFFIXES = {".py", ".html", ".js", ".sql"}


def _files():
    for folder in ("novelforge_sessions", "reviews", "templates", "static", "bench", "scripts", "harness"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in SUFFIXES and "migrations" not in path.parts and path not in CORE and ".venv" not in path.parts:
                yield path


def test_no_state_name_is_a_literal_outside_the_core():
    found = []
    for path in _files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if any(p.search(line) for p in PATTERNS):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:160]}")
    assert not found, "state literals outside the core:\n" + "\n".join(found)


def test_the_scan_would_catch_a_literal():
    samples = [
        "h.state = 'claimed' AND x", "if run.state == \"open\":", "state=\"assigned\",",
        "AND s.status NOT IN ('terminated', 'stale')", "Literal[\"idle\", \"completed\"]",
        "{% if r.state == \"live\" %}", "row.status === \"failed\"", "qs.filter(state__in=[\"bound\", \"conflicted\"])",
    ]
    for sample in samples:
        assert any(p.search(sample) for p in PATTERNS), sample
    for harmless in ['{"pending": {"handoffs": []}}', 'StepResult("results", True, "bound", {"bound": bound})']:
        assert not any(p.search(harmless) for p in PATTERNS), harmless


# ---- every status write goes through the one transition helper -----------------------------
HELPER = ROOT / "novelforge_sessions" / "actions" / "lifecycle.py"
_UPDATE_CALL = re.compile(r"\.update\(((?:[^()]|\([^()]*\))*)\)", re.S)
_STATE_KWARG = re.compile(r"(?<![\w.])(?:state|status)\s*=(?!=)")
_WRITES = [
    re.compile(r"""update_fields\s*=\s*\[[^\]]*['"](?:state|status)['"]"""),  # obj.save(update_fields=["state", ...])
    re.compile(r"""\.(?:state|status)\s*=(?!=)(?!\s*(?:%\(|ANY\())"""),  # obj.state = ... (not SQL's h.state = %(x)s)
]


def _status_writes(text: str) -> list[int]:
    lines = [n for n, line in enumerate(text.splitlines(), 1) if any(p.search(line) for p in _WRITES)]
    for call in _UPDATE_CALL.finditer(text):
        if _STATE_KWARG.search(call.group(1)):
            lines.append(text.count("\n", 0, call.start()) + 1)
    return sorted(lines)


def test_every_status_write_goes_through_the_transition_helper():
    """``actions.lifecycle.move``/``move_rows`` (and ``apply_transition`` for sessions) are the
    only places a state column is assigned and saved, or updated by the ORM; raw SQL status
    writes take their values from the tables (``Lifecycle.sources``) as parameters."""
    found = []
    for path in _files():
        if path.suffix != ".py" or path == HELPER:
            continue
        text = path.read_text(encoding="utf-8")
        for number in _status_writes(text):
            found.append(f"{path.relative_to(ROOT)}:{number}: {text.splitlines()[number - 1].strip()[:160]}")
    assert not found, "status writes outside the transition helper:\n" + "\n".join(found)


def test_the_write_scan_would_catch_a_write():
    for sample in ['gate.state = ReviewGate.State.CANCELLED', 'h.save(update_fields=["state", "cancelled_at"])',
                   'Handoff.objects.filter(id=1).update(\n    state=HandoffState.BOUND, bound_at=now,\n)',
                   'qs.update(status=S.RUNNING)']:
        assert _status_writes(sample), sample
    for harmless in ['if gate.state == ReviewGate.State.PENDING:', 'handoff.state, handoff.bound_at = H.BOUND, now',
                     'Run.objects.filter(id=1, state=R.OPEN).update(pending_external=[])', 'values.update(override)',
                     "AND r.state = %(live)s AND h.state = ANY(%(claim_from)s)"]:
        assert not _status_writes(harmless), harmless
