"""Every record's declared lifecycle (novelforge_sessions/lifecycles.py): tables validated,
every pair checked against an independent copy, and refusals typed and deterministic."""
from __future__ import annotations

import itertools
from enum import StrEnum

import pytest

from novelforge_sessions import lifecycles as lc
from novelforge_sessions import session_runtime as rt
from tests.sessions.test_lifecycle_table import CONTRACT

# Written out independently of the module under test (state → legal targets).
EXPECTED = {
    "session": CONTRACT,  # the session table, written out in test_lifecycle_table
    "run": {
        "open": {"completed", "failed", "aborted", "interrupted", "terminated"},
        "completed": set(), "failed": set(), "aborted": set(), "interrupted": set(), "terminated": set(),
    },
    "runtime": {"live": {"closed", "lost"}, "closed": set(), "lost": set()},
    "handoff": {
        "pending": {"claimed", "cancelled"},
        "claimed": {"claimed", "bound", "cancelled"},
        "bound": {"conflicted"},
        "conflicted": {"bound"},
        "cancelled": set(),
    },
    "write intent": {
        "proposed": {"approved", "rejected", "executed", "refused"},
        "approved": {"proposed", "approved", "rejected", "executed", "refused"},
        "rejected": set(), "executed": set(), "refused": set(),
    },
    "review gate": {"pending": {"complete", "cancelled"}, "complete": set(), "cancelled": set()},
    "review assignment": {"open": {"assigned"}, "assigned": {"assigned", "submitted"}, "submitted": set()},
    "webhook delivery": {"pending": {"pending", "delivered", "failed"}, "delivered": set(), "failed": {"pending"}},
}

BY_NAME = {lifecycle.record: lifecycle for lifecycle in lc.ALL}
PAIRS = [
    (name, src, dst)
    for name, table in EXPECTED.items()
    for src, dst in itertools.product(table, repeat=2)
]


def test_every_record_with_states_is_declared():
    assert set(BY_NAME) == set(EXPECTED)
    for name, lifecycle in BY_NAME.items():
        assert set(lifecycle.values()) == set(EXPECTED[name]), name


def test_every_declared_table_is_valid():
    lc.validate_all()
    for lifecycle in lc.ALL:
        assert lifecycle.terminal, f"{lifecycle.record} can end"
        for state in lifecycle.terminal:
            assert not lifecycle.table[state], "terminal states have no exit"


def test_the_session_lifecycle_is_the_contract_table():
    S = lc.SessionStatus
    assert lc.SESSION.table == {S(src): frozenset(S(d) for d in dsts) for src, dsts in CONTRACT.items()}
    assert lc.SESSION.field == "status"


@pytest.mark.parametrize(("name", "src", "dst"), PAIRS)
def test_every_pair_matches_the_declaration(name, src, dst):
    lifecycle = BY_NAME[name]
    legal = dst in EXPECTED[name][src]
    assert lifecycle.is_legal(src, dst) is legal
    if legal:
        assert lifecycle.check(src, dst) == dst
        assert src in lifecycle.sources(dst)
    else:
        with pytest.raises(rt.IllegalTransition) as info:
            lifecycle.check(src, dst)
        assert info.value.code == "illegal_transition"
        assert info.value.details == {
            "record": name, "from": src, "to": dst, "allowed": sorted(EXPECTED[name][src]),
        }
        assert src not in lifecycle.sources(dst)


def test_unknown_state_names_are_typed_validation_errors():
    with pytest.raises(rt.InvalidPayload) as info:
        lc.HANDOFF.check("pending", "exploded")
    assert info.value.details["field"] == "state"
    assert "exploded" in info.value.message


def test_validation_catches_a_malformed_table():
    class Light(StrEnum):
        RED = "red"
        GREEN = "green"
        BROKEN = "broken"

    unreachable = lc.Lifecycle("light", Light, Light.RED, {Light.RED: frozenset({Light.GREEN}),
                                                           Light.GREEN: frozenset({Light.RED}),
                                                           Light.BROKEN: frozenset()})
    with pytest.raises(lc.LifecycleTableError, match="unreachable"):
        unreachable.validate()
    missing_row = lc.Lifecycle("light", Light, Light.RED, {Light.RED: frozenset({Light.GREEN, Light.BROKEN}),
                                                           Light.GREEN: frozenset()})
    with pytest.raises(lc.LifecycleTableError, match="rows missing"):
        missing_row.validate()



def test_passes_waits_names_the_moves_a_held_run_may_not_make():
    """Continuing (an awaiting session → running) and ending the run completed (running → idle |
    completed) pass a run's waits; failing, terminating, going stale or waiting again do not."""
    S = lc.SessionStatus
    passing = {(src, dst) for src in S for dst in S if lc.SESSION.is_legal(src, dst) and lc.passes_waits(src, dst)}
    assert passing == {
        (S.AWAITING_USER, S.RUNNING), (S.AWAITING_EXTERNAL, S.RUNNING), (S.RUNNING, S.IDLE), (S.RUNNING, S.COMPLETED),
    }
