"""The pure lifecycle core: every one of the 9×9 (from, to) pairs against docs/model.md#session-lifecycle."""
from __future__ import annotations

import itertools

import pytest

from novelforge_sessions import lifecycles as lc
from tests.support.lifecycle import SESSION_TRANSITIONS

S = lc.SessionStatus

# docs/model.md#session-lifecycle, written out by hand independently of the module under test (tests/support/lifecycle.py).
CONTRACT = SESSION_TRANSITIONS

PAIRS = list(itertools.product([s.value for s in S], repeat=2))


def test_there_are_nine_states_and_81_pairs():
    assert len(S) == 9
    assert len(PAIRS) == 81
    assert set(CONTRACT) == {s.value for s in S}


def test_the_declared_session_lifecycle_is_the_contract_s_table():
    """``lifecycles.SESSION`` (what the transition helper checks) holds exactly this table too."""
    assert {src.value: {dst.value for dst in dsts} for src, dsts in lc.SESSION.table.items()} == CONTRACT


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_every_pair_matches_the_contract(src, dst):
    legal = dst in CONTRACT[src]
    assert lc.SESSION.is_legal(src, dst) is legal
    if legal:
        assert lc.SESSION.check(src, dst) is S(dst)
    else:
        with pytest.raises(lc.IllegalTransition) as info:
            lc.SESSION.check(src, dst)
        assert info.value.code == "illegal_transition"
        assert info.value.details == {"record": "session", "from": src, "to": dst, "allowed": sorted(CONTRACT[src])}


def test_illegal_transitions_are_deterministic():
    errors = []
    for _ in range(3):
        with pytest.raises(lc.IllegalTransition) as info:
            lc.SESSION.check("completed", "running")
        errors.append((info.value.code, info.value.message, info.value.details))
    assert errors[0] == errors[1] == errors[2]


def test_table_is_structurally_sound():
    lc.SESSION.validate()
    assert lc.SESSION.terminal == {S.TERMINATED}
    assert S.CREATED not in set().union(*lc.SESSION.table.values()), "nothing returns to created"


def test_unknown_states_are_validation_errors_not_crashes():
    with pytest.raises(lc.InvalidPayload) as info:
        lc.SESSION.check("running", "paused")
    assert info.value.details == {"field": "status", "allowed": [s.value for s in S]}
    with pytest.raises(lc.InvalidPayload):
        lc.SESSION.check("zombie", "running")


@pytest.mark.parametrize("module", ["session_runtime", "lifecycles"])
def test_the_core_imports_nothing_from_django(module):
    import ast
    import importlib
    import inspect

    tree = ast.parse(inspect.getsource(importlib.import_module(f"novelforge_sessions.{module}")))
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not any(name.startswith("django") for name in imported), imported
