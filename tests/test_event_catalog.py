"""Typed event constructors. Every event type is a catalog constant with declared
payload fields; ``events.append`` and ``Outbox.add`` take only those constants; every constant
is emitted somewhere (no dead types) and no emission site names a type by string."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.db import transaction

from novelforge_sessions import event_types as ev
from novelforge_sessions import events
from novelforge_sessions.actions.lifecycle import RUNTIME_END_EVENTS, Outbox
from novelforge_sessions.control.models import INTENT_EXECUTED_EVENTS
from novelforge_sessions.models import Event, Session

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    p for d in ("novelforge_sessions", "reviews") for p in (ROOT / d).rglob("*.py")
    if "migrations" not in p.parts and p.name != "event_types.py"
)
#: Catalog constant name (``SESSION_CREATED``) → its event type.
CONSTANTS = {name: value for name, value in vars(ev).items() if isinstance(value, ev.EventType)}


def _type_arg(call: ast.Call) -> ast.expr | None:
    """The event-type argument of an emission call, or None if ``call`` is not one.

    Emission calls: ``<outbox>.add(session, TYPE, ...)``, ``events.append(type=TYPE, ...)``,
    ``events.stage(type=TYPE, ...)`` and ``events.stage_in_locking_statement(type=TYPE, ...)`` (an
    event inserted by its write's own statement), ``TYPE.filled_by_statement(...)`` (the same, for
    a statement that inserts several, control/batch.py) and ``_event(intent, TYPE, ...)``
    (control/intents.py's wrapper around ``events.append``)."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ("append", "stage", "stage_in_locking_statement") \
            and isinstance(func.value, ast.Name) and func.value.id == "events":
        return next((k.value for k in call.keywords if k.arg == "type"), None)
    if isinstance(func, ast.Attribute) and func.attr == "filled_by_statement":
        return func.value
    if isinstance(func, ast.Attribute) and func.attr == "add" and isinstance(func.value, ast.Name) \
            and "outbox" in func.value.id.lower() and len(call.args) >= 2:
        return call.args[1]
    if isinstance(func, ast.Name) and func.id == "_event" and len(call.args) >= 2:
        return call.args[1]
    return None


def _emission_sites() -> list[tuple[str, int, ast.expr]]:
    sites = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (arg := _type_arg(node)) is not None:
                sites.append((str(path.relative_to(ROOT)), node.lineno, arg))
    return sites


def _constant_named(arg: ast.expr) -> ev.EventType | None:
    if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "ev":
        return CONSTANTS.get(arg.attr)
    return None


def test_every_declared_event_type_is_emitted_somewhere():
    sites = _emission_sites()
    assert len(sites) > 30, "the scan found the emission sites"
    emitted = {c for _, _, arg in sites if (c := _constant_named(arg)) is not None}
    # Emitted through a map chosen by state / kind (end_runtime, execute_intent).
    emitted |= set(RUNTIME_END_EVENTS.values()) | set(INTENT_EXECUTED_EVENTS.values())
    dead = sorted(e.name for e in set(ev.CATALOG.values()) - emitted)
    assert not dead, f"declared but never emitted: {dead}"
    assert set(CONSTANTS.values()) == set(ev.CATALOG.values())


def test_every_emission_site_names_a_catalog_constant():
    #: Sites that pass a type through (the wrappers and the maps above), by file and variable.
    pass_through = {
        ("novelforge_sessions/actions/lifecycle.py", "Subscript"),  # RUNTIME_END_EVENTS[state]
        ("novelforge_sessions/control/intents.py", "type"),  # _event(...) → events.append(type=type)
        ("novelforge_sessions/control/intents.py", "follow"),  # INTENT_EXECUTED_EVENTS[kind]
        ("novelforge_sessions/events.py", "type"),  # stage_in_locking_statement(type=...) checks its caller's
    }
    wrong = []
    for where, line, arg in _emission_sites():
        if _constant_named(arg) is not None:
            continue
        key = arg.id if isinstance(arg, ast.Name) else type(arg).__name__
        if (where, key) not in pass_through:
            wrong.append(f"{where}:{line}: {ast.unparse(arg)}")
    assert not wrong, wrong


def test_no_string_literal_event_types_left_in_the_code():
    patterns = [
        re.compile(r"outbox\.add\(\s*\w+\s*,\s*f?[\"']"),
        re.compile(r"\btype\s*=\s*f?[\"'][a-z_]+\.[a-z_]+[\"']"),
        re.compile(r"\bEventType\("),  # event types are declared in the catalog only
    ]
    hits = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in SOURCES for n, line in enumerate(p.read_text().splitlines(), 1)
        if any(pat.search(line) for pat in patterns)
    ]
    assert not hits, hits


def test_maps_cover_every_state_and_kind():
    from novelforge_sessions import session_runtime as rt
    from novelforge_sessions.control.models import IntentKind

    assert set(RUNTIME_END_EVENTS) == set(rt.RuntimeState) - {rt.RuntimeState.LIVE}
    assert set(INTENT_EXECUTED_EVENTS) == set(IntentKind)


def test_a_constructor_checks_its_declared_fields():
    payload = ev.RUN_CURSOR_ADVANCED(seq=1, cursor={"chapter": 2})
    assert payload == {"seq": 1, "cursor": {"chapter": 2}}
    with pytest.raises(TypeError, match="missing \\['cursor'\\]"):
        ev.RUN_CURSOR_ADVANCED(seq=1)
    with pytest.raises(TypeError, match="unknown \\['colour'\\]"):
        ev.RUN_CURSOR_ADVANCED(seq=1, cursor={}, colour="red")
    with pytest.raises(TypeError):
        ev.RUN_CURSOR_ADVANCED(1, {})  # keyword arguments only
    # optional fields may be left out
    assert ev.WRITE_INTENT_REFUSED(intent_id=1, code="c", stated="a", current="b", current_state={})
    assert ev.family_of("handoff.claimed") == "handoff" and ev.family_of("no.such") == "other"


def test_a_payload_some_of_whose_fields_the_statement_fills_is_checked_without_them():
    filled = frozenset({"checkpoint_id", "seq"})
    payload = ev.CHECKPOINT_RECORDED.filled_by_statement(filled, boundary="context_freeze", cursor={})
    assert payload == {"boundary": "context_freeze", "cursor": {}}
    with pytest.raises(TypeError, match="missing \\['cursor'\\]"):  # what the statement does not fill is required
        ev.CHECKPOINT_RECORDED.filled_by_statement(filled, boundary="context_freeze")
    with pytest.raises(TypeError, match="unknown \\['colour'\\]"):
        ev.CHECKPOINT_RECORDED.filled_by_statement(filled, boundary="b", cursor={}, colour="red")
    with pytest.raises(TypeError, match="cannot be filled"):  # only declared fields, and not given twice
        ev.CHECKPOINT_RECORDED.filled_by_statement(frozenset({"colour"}), boundary="b", cursor={})
    with pytest.raises(TypeError, match="cannot be filled"):
        ev.CHECKPOINT_RECORDED.filled_by_statement(filled, boundary="b", cursor={}, seq=1)


@pytest.mark.django_db
def test_append_with_a_string_type_raises_and_writes_nothing(project):
    before = Event.objects.count()
    with transaction.atomic():
        with pytest.raises(TypeError):
            events.append(project_id=project.id, type="session.created", payload={})
        with pytest.raises(TypeError):  # a catalog constant, but the payload misses its fields
            events.append(project_id=project.id, type=ev.RUN_CURSOR_ADVANCED, payload={"seq": 1})
    assert Event.objects.count() == before


@pytest.mark.django_db
def test_outbox_add_takes_only_catalog_constants(new_session):
    session = Session.objects.get(id=new_session()["id"])
    outbox = Outbox("test")
    with pytest.raises(TypeError):
        outbox.add(session, "run.cursor_advanced", seq=1, cursor={})
    with pytest.raises(TypeError):
        outbox.add(session, ev.RUN_CURSOR_ADVANCED, seq=1, cursour={})
    assert outbox.items == []
    outbox.add(session, ev.RUN_CURSOR_ADVANCED, seq=1, cursor={})
    before = Event.objects.count()
    with transaction.atomic():
        (event_id,) = outbox.flush()
    event = Event.objects.get(id=event_id)
    assert Event.objects.count() == before + 1
    assert event.type == "run.cursor_advanced" and event.payload == {"seq": 1, "cursor": {}}
    assert events.serialize(event)["family"] == "run"


@pytest.mark.django_db
def test_events_filter_by_type_is_validated_against_the_catalog(owner, new_session):
    new_session(run=True)
    before = Event.objects.count()
    bad = owner.get("/events", type="session.started")
    assert bad.status_code == 422, bad.content
    error = bad.json()["error"]
    assert error["code"] == "validation_error" and error["details"]["field"] == "type"
    items = owner.get("/events", type=ev.RUN_STARTED.name).json()["items"]
    assert [(e["type"], e["family"]) for e in items] == [("run.started", "run")]
    assert Event.objects.count() == before


@pytest.mark.django_db
def test_the_openapi_lists_the_catalog_as_the_type_filter_and_family_as_a_field():
    from django.test import Client

    schema = Client().get("/api/openapi.json").json()
    params = {p["name"]: p for p in schema["paths"]["/api/v1/events"]["get"]["parameters"]}
    text = str(params["type"]["schema"])
    assert all(f"'{name}'" in text for name in ev.CATALOG), text
    assert "family" in schema["components"]["schemas"]["EventOut"]["required"]
