"""The event log: appended with the change, ordered, pageable by ``after``; rollbacks leave nothing."""
from __future__ import annotations

import pytest
from django.db import transaction

from novelforge_sessions import events
from novelforge_sessions.event_types import EventType
from novelforge_sessions.models import Event

#: Test-only event types (not in the catalog: production code emits only catalog constants).
DOOMED, KEPT, LOOSE = (EventType(n, frozenset()) for n in ("doomed", "kept", "loose"))

pytestmark = pytest.mark.django_db


def test_events_page_by_after_in_order(owner, new_session):
    for _ in range(3):
        new_session(run=True)
    seen, after = [], None
    while True:
        page = owner.get("/events", limit=4, **({"after": after} if after else {})).json()
        seen += [e["id"] for e in page["items"]]
        after = page["next_after"]
        if after is None:
            break
    assert seen == sorted(seen) and len(seen) == len(set(seen)) == Event.objects.count()
    assert len(seen) == 3 * 4  # created, runtime.attached, run.started, session.transitioned


def test_events_filter_by_session_and_type(owner, new_session):
    a, b = new_session(run=True), new_session()
    items = owner.get("/events", session_id=a["id"], type="run.started").json()["items"]
    assert [e["session_id"] for e in items] == [a["id"]]
    assert all(e["session_id"] == b["id"] for e in owner.get("/events", session_id=b["id"]).json()["items"])


def test_transition_event_carries_what_happened(owner, new_session):
    s = new_session(run=True)
    owner.post(f"/sessions/{s['id']}/transition", {"to": "awaiting_user", "reason": "question for the author"})
    e = owner.get("/events", session_id=s["id"], type="session.transitioned").json()["items"][-1]
    assert e["payload"] == {"from": "running", "to": "awaiting_user", "reason": "question for the author", "version": 3}
    assert e["actor"].startswith("token:owner#")


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_change_leaves_no_event_and_sends_no_wakeup(project, monkeypatch):
    sent = []
    monkeypatch.setattr(events._Wakeup, "__call__", lambda self: sent.append(dict(self.max_ids)))
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            events.append(project_id=project.id, type=DOOMED)
            raise RuntimeError("abort")
    assert not Event.objects.filter(type="doomed").exists() and sent == []
    with transaction.atomic():
        first = events.append(project_id=project.id, type=KEPT)
        second = events.append(project_id=project.id, type=KEPT)
    assert sent == [{project.id: second}] and second > first, "one wake-up per transaction, after commit"


@pytest.mark.django_db(transaction=True)
def test_append_outside_a_transaction_is_refused(project):
    with pytest.raises(RuntimeError):
        events.append(project_id=project.id, type=LOOSE)
