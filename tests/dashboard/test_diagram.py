"""The lifecycle diagram is drawn from the contract's table (no second copy of it)."""
from __future__ import annotations

import pytest

from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.dashboard.presenters import build_diagram, describe


@pytest.mark.parametrize("status", [s.value for s in rt.SessionStatus])
def test_nodes_edges_current_and_next_come_from_the_table(status):
    d = build_diagram(status, [])
    assert [n.state for n in d.nodes] == [s.value for s in rt.SessionStatus]
    assert {(e.source, e.target) for e in d.edges} == {
        (src.value, dst.value) for src, targets in lc.SESSION.table.items() for dst in targets
    }
    assert [n.state for n in d.nodes if "current" in n.classes.split()] == [status]
    assert {n.state for n in d.nodes if "next" in n.classes.split()} == {
        s.value for s in lc.SESSION.table[rt.SessionStatus(status)]
    }
    assert {e.target for e in d.edges if "next" in e.classes.split()} == set(d.allowed)


def test_the_path_taken_is_traced_with_counts():
    taken = [("created", "running"), ("running", "idle"), ("idle", "running"), ("running", "idle"), ("idle", "running")]
    d = build_diagram("running", taken)
    counts = {(e.source, e.target): e.count for e in d.edges if e.count}
    assert counts == {("created", "running"): 1, ("running", "idle"): 2, ("idle", "running"): 2}
    assert all("taken" in e.classes for e in d.edges if e.count)
    assert d.path == ["created", "running", "idle", "running", "idle", "running"]
    assert {n.state for n in d.nodes if "visited" in n.classes} == {"created", "running", "idle"}


def test_nodes_do_not_overlap_and_fit_the_canvas():
    d = build_diagram("created", [])
    for n in d.nodes:
        assert 0 <= n.left and n.left + d.node_w <= d.width and 0 <= n.top and n.top + d.node_h <= d.height
    for a in d.nodes:
        for b in d.nodes:
            if a is not b:
                assert abs(a.x - b.x) >= d.node_w or abs(a.y - b.y) >= d.node_h, (a.state, b.state)


def test_event_summaries():
    assert describe("session.transitioned", {"from": "running", "to": "idle", "reason": "done"}) == "running → idle · done"
    assert describe("checkpoint.recorded", {"seq": 2, "boundary": "user_wait"}) == "checkpoint #2 · user wait"
    assert describe("custom.thing", {"a": 1, "nested": {"x": 1}, "b": "x" * 200}).startswith("a=1 · b=xxx")
    assert len(describe("custom.thing", {"b": "x" * 200})) == 120
