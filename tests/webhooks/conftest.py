"""Fixtures of the webhook tests: a loopback receiver, a token with ``manage``, events made through the API."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.models import Event
from tests.support.factories import SESSION, Api
from tests.webhooks.receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def manager(project) -> Api:
    """A token with ``manage`` (and ``read``, ``write`` to make events)."""
    _, raw = create_token(project, name="manager", permissions=["manage", "read", "write"])
    return Api(raw)


@pytest.fixture
def allow_private(settings):
    """The loopback receiver is a private address: allowed, as docs/webhooks.md#private-addresses says."""
    settings.WEBHOOK_ALLOW_PRIVATE = True
    return settings


def register(api: Api, url: str, event_types: list[str]) -> dict:
    resp = api.post("/webhooks", {"url": url, "event_types": event_types})
    assert resp.status_code == 201, resp.content
    return resp.json()


def make_sessions(api: Api, n: int) -> list[int]:
    """``n`` sessions through the API (each writes ``session.created``); their ids."""
    ids = []
    for _ in range(n):
        resp = api.post("/sessions", SESSION)
        assert resp.status_code == 201, resp.content
        ids.append(resp.json()["id"])
    return ids


def events_of(project_id: int, after: int = 0, types: tuple[str, ...] | None = None) -> list[Event]:
    qs = Event.objects.filter(project_id=project_id, id__gt=after).order_by("id")
    if types is not None:
        qs = qs.filter(type__in=types)
    return list(qs)
