"""Fixtures for the review tests (see ``factories`` for the world they build)."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import Client

from tests.reviews.factories import World, make_world


@pytest.fixture
def world(project) -> World:
    return make_world(project)


@pytest.fixture
def as_user(world: World) -> Callable[..., Client]:
    """A logged-in browser-like client for one of the world's users."""

    def make(username: str, **kw) -> Client:
        client = Client(**kw)
        client.force_login(world.users[username])
        return client

    return make
