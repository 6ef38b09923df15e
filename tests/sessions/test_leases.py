"""The one liveness predicate (docs/model.md#runtimes-and-leases): pure (``novelforge_sessions.leases``) and in SQL
(``RuntimeAttachment.objects.live()``), and they agree."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone as dt_timezone

import pytest
from django.utils import timezone

from novelforge_sessions import leases
from novelforge_sessions import session_runtime as rt
from novelforge_sessions.actions.lifecycle import live_runtime
from novelforge_sessions.models import RuntimeAttachment, Session

LIVE, LOST, CLOSED = rt.RuntimeState.LIVE, rt.RuntimeState.LOST, rt.RuntimeState.CLOSED


def test_the_pure_predicate_expires_at_the_instant_the_lease_ends():
    now = datetime(2026, 12, 1, 9, 0, tzinfo=dt_timezone.utc)
    second = timedelta(seconds=1)
    assert leases.lease_expired(now, now) and leases.lease_expired(now - second, now)
    assert not leases.lease_expired(now + second, now) and not leases.lease_expired(None, now)
    assert leases.runtime_is_live(LIVE, now + second, now)
    assert not leases.runtime_is_live(LIVE, now, now), "a lease ending now is over"
    assert not leases.runtime_is_live(CLOSED, now + second, now) and not leases.runtime_is_live(LOST, now + second, now)
    assert leases.runtime_lease_expired(LIVE, now, now) and not leases.runtime_lease_expired(LIVE, now + second, now)
    assert not leases.runtime_lease_expired(LOST, now - second, now), "a lost runtime is tidied, not 'expired'"


@pytest.mark.django_db
def test_the_queryset_says_what_the_predicate_says(caller, owner, new_session):
    fresh, stale = new_session(), new_session()
    RuntimeAttachment.objects.filter(session_id=stale["id"]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert list(RuntimeAttachment.objects.live().values_list("session_id", flat=True)) == [fresh["id"]]
    assert list(RuntimeAttachment.objects.lease_expired().values_list("session_id", flat=True)) == [stale["id"]]
    for a in RuntimeAttachment.objects.all():
        assert a.live == leases.runtime_is_live(a.state, a.lease_expires_at, timezone.now())
    assert live_runtime(Session.objects.get(id=stale["id"]), lock=False) is None


def test_the_pure_module_imports_no_django():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(leases))
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if n.split(".")[0] == "django"], names
