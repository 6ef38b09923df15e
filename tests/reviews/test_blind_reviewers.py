"""A project manager cannot be made a "blind" reviewer.

A manager of the project can open the writer's session page (cursor, pending items, another
reviewer's note), so a packet shown to them is not blind. On the original code a page gate
accepted a user who was both a reviewer and a manager of the project; now opening the gate is
refused with 403 ``independence_violation`` naming ``reviewers[i]``, and nothing is written.
"""
from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from novelforge_sessions.models import Membership
from tests.support.factories import make_project
from tests.reviews.factories import RUBRIC, World
from tests.support.responses import refused
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db


def body(world: World, **over: Any) -> dict[str, Any]:
    b = {"candidate_version_id": world.version.id, "rubric": RUBRIC, "route": "page", "reviewers": ["alice"]}
    b.update(over)
    return b


@pytest.mark.parametrize("route", ["page", "relay"])
def test_a_manager_of_the_project_is_refused_as_a_reviewer(world, route):
    mia = world.users["mia"]
    Membership.objects.create(user=mia, project=world.project, role=Membership.Role.REVIEWER)
    # Why it matters: as a manager, mia opens the writer's session page.
    client = Client()
    client.force_login(mia)
    assert client.get(f"/sessions/{world.writer.id}/").status_code == 200

    before = snapshot()
    err = refused(world.writer_api.post(f"/sessions/{world.writer.id}/review-gates",
                                        body(world, route=route, reviewers=["alice", "mia"])),
                                                403, "independence_violation", "reviewers[1]")
    assert "manages this project" in err["message"] and "blind" in err["message"]
    assert snapshot() == before
    world.refresh()
    assert world.writer.status == "running"


def test_a_superuser_reviewer_is_refused(world):
    alice = world.users["alice"]
    alice.is_superuser = True
    alice.save(update_fields=["is_superuser"])
    before = snapshot()
    refused(world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", body(world)),
            403, "independence_violation", "reviewers[0]")
    assert snapshot() == before


def test_a_manager_of_another_project_may_review_here(world):
    elsewhere = make_project("elsewhere")
    Membership.objects.create(user=world.users["bob"], project=elsewhere, role=Membership.Role.MANAGER)
    resp = world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", body(world, reviewers=["bob"]))
    assert resp.status_code == 201, resp.content


def test_a_plain_reviewer_cannot_open_the_writers_session_page(world):
    """The contrast: a reviewer without a manager membership is blind (404 on the session page)."""
    client = Client()
    client.force_login(world.users["alice"])
    assert client.get(f"/sessions/{world.writer.id}/").status_code == 404
