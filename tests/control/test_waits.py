"""The wait-kind registry (``control/waits.py``): what a run waits on, through an interface
apps register with. The control plane imports nothing from ``reviews`` (docs/model.md#waits)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import novelforge_sessions
from novelforge_sessions.control import waits
from novelforge_sessions.models import Run, Session
from tests.control.conftest import make_handoff

ROOT = Path(novelforge_sessions.__file__).parent
#: the control plane, and the session actions that use the registry
CONTROL_MODULES = [*sorted((ROOT / "control").rglob("*.py")), ROOT / "session_runtime.py"]


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", CONTROL_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_control_plane_imports_nothing_from_reviews(path):
    assert not {m for m in imported_modules(path) if m == "reviews" or m.startswith("reviews.")}


def test_the_check_sees_an_import_of_reviews(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from reviews.models import ReviewGate\n")
    assert "reviews.models" in imported_modules(bad)


def test_handoffs_and_review_gates_are_registered_kinds():
    by_key = {k.pending_key: k for k in waits.kinds()}
    assert set(by_key) >= {"handoffs", "gates"} and waits.pending_keys() >= {"handoffs", "gates"}
    assert by_key["handoffs"] is waits.HANDOFFS and by_key["handoffs"].step is None
    assert by_key["gates"].name == "review_gate" and by_key["gates"].step == "reviews"
    assert waits.kind_for("gates") is by_key["gates"] and waits.kind_for("nope") is None


def test_a_clashing_kind_is_refused_and_re_registering_is_idempotent():
    def noop(*a):
        return []

    with pytest.raises(ValueError):
        waits.register(waits.WaitKind(name="other", pending_key="handoffs", resolve=noop, waiting=noop, carry_over=noop))
    with pytest.raises(ValueError):
        waits.WaitKind(name="x", pending_key="x", resolve=noop, waiting=noop, carry_over=noop, step="x")
    before = waits.kinds()
    waits.register(waits.HANDOFFS)
    assert waits.kinds() == before


@pytest.mark.django_db
def test_waiting_on_lists_what_the_open_run_waits_on(owner, running):
    make_handoff(owner, running["run"]["id"], "j1")
    session, run = Session.objects.get(id=running["id"]), Run.objects.get(id=running["run"]["id"])
    got = waits.waiting_on(session, run)
    assert list(got) == ["handoffs"]
    assert [(h["logical_id"], h["state"]) for h in got["handoffs"]] == [("j1", "pending")]


@pytest.mark.django_db
def test_handoffs_never_hold_a_run_and_holding_asks_every_kind_that_can(owner, running):
    """Job handoffs do not hold the run (it may go on while a worker works); review gates do
    (``reviews/waits.py``). Session actions reach the registry through the hook apps.py installs."""
    from novelforge_sessions.actions import lifecycle

    assert waits.HANDOFFS.holds is None and waits.kind_for("gates").holds is not None
    assert lifecycle._holds_query is waits.holding
    make_handoff(owner, running["run"]["id"], "j1")
    session, run = Session.objects.get(id=running["id"]), Run.objects.get(id=running["run"]["id"])
    assert waits.holding(session, run) == [] and waits.awaiting_status([]) is None
