"""A reviewer must still be blind when the verdict is bound, not only when the gate opened.

Eligibility was checked once, when the gate assigned its reviewers. A reviewer made a manager
of the project afterwards (or a superuser, or staff with an admin view of the writer's records)
can open the writer's session page or records, yet could still bind a verdict on main. Now the
verdict is refused with 403 ``independence_violation`` (``details.reason``), the page says so,
and nothing is written. The same rule for staff applies when the gate is opened.
"""
from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from novelforge_sessions.errors import IndependenceViolation
from novelforge_sessions.models import Membership
from reviews import actions
from reviews.access import reviewer_for_user, sighted_reason
from reviews.models import ReviewAssignment, Verdict
from tests.reviews.factories import RUBRIC, World, verdict_for
from tests.reviews.test_pages import form_post
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db


def perm(codename: str, app: str = "novelforge_sessions") -> Permission:
    return Permission.objects.get(codename=codename, content_type__app_label=app)


def promote(world: World, how: str) -> None:
    alice = world.users["alice"]
    if how == "manager":
        Membership.objects.create(user=alice, project=world.project, role=Membership.Role.MANAGER)
    elif how == "superuser":
        alice.is_superuser = True
        alice.save(update_fields=["is_superuser"])
    else:  # staff who may read sessions in the admin
        alice.is_staff = True
        alice.save(update_fields=["is_staff"])
        alice.user_permissions.add(perm("view_session"))


@pytest.mark.parametrize("how", ["manager", "superuser", "staff"])
def test_a_reviewer_promoted_after_the_assignment_cannot_bind_a_verdict(world, how):
    gate = world.gate(route="page", reviewers=["alice"])
    promote(world, how)
    before = snapshot()
    with pytest.raises(IndependenceViolation) as refused:
        actions.bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id, verdict_for(gate), channel="page")
    assert refused.value.details["reason"] == how and refused.value.details["gate_id"] == gate.id
    assert "blind" in refused.value.message
    assert snapshot() == before
    assert not Verdict.objects.exists()
    assert ReviewAssignment.objects.get(packet=gate.packet).state == ReviewAssignment.State.ASSIGNED


def test_the_packet_page_says_why_the_verdict_was_refused(world):
    gate = world.gate(route="page", reviewers=["alice"])
    promote(world, "manager")
    client = Client()
    client.force_login(world.users["alice"])
    before = snapshot()
    resp = client.post(f"/reviews/packets/{gate.packet.id}/", form_post(gate))
    assert resp.status_code == 403
    html = resp.content.decode()
    assert "independence_violation" in html and "manages this project" in html
    assert snapshot() == before


def test_a_reviewer_who_stays_blind_still_binds(world):
    gate = world.gate(route="page", reviewers=["alice"])
    # A manager elsewhere, staff without any admin permission: still blind here.
    from tests.support.factories import make_project

    Membership.objects.create(user=world.users["alice"], project=make_project("elsewhere"),
                              role=Membership.Role.MANAGER)
    alice = world.users["alice"]
    alice.is_staff = True
    alice.save(update_fields=["is_staff"])
    bound = actions.bind_verdict(reviewer_for_user(alice), gate.packet.id, verdict_for(gate), channel="page")
    assert bound.created and Verdict.objects.count() == 1


@pytest.mark.parametrize("codenames", [
    ("add_apitoken", "view_apitoken", "view_project"),  # mints a project token: every verdict through the API
    ("view_artifactversion", "view_artifact"),  # the candidate's "created by": the writer's identity
    ("view_membership",),
    ("change_user",),  # the auth admin: grants itself the rest
])
def test_staff_with_any_admin_permission_cannot_review_blind(world, codenames):
    """An outside check: a staff reviewer holding only permissions outside a list of 'sighted'
    ones minted a token in the admin, read the other reviewer's verdict through the API, and
    bound their own. Any admin permission now makes a staff user sighted, at assignment and at
    binding."""
    gate = world.gate(route="page", reviewers=["alice"])
    alice = world.users["alice"]
    alice.is_staff = True
    alice.save(update_fields=["is_staff"])
    alice.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    alice = type(alice).objects.get(pk=alice.pk)  # no cached permissions
    before = snapshot()
    with pytest.raises(IndependenceViolation) as refused:
        actions.bind_verdict(reviewer_for_user(alice), gate.packet.id, verdict_for(gate), channel="page")
    assert refused.value.details["reason"] == "staff"
    assert snapshot() == before and not Verdict.objects.exists()
    # the rule assignment applies too (its API refusal: the view_checkpoint test below)
    assert sighted_reason(alice, world.project.id) == "staff"


def gate_body(world: World, **over: Any) -> dict[str, Any]:
    return {"candidate_version_id": world.version.id, "rubric": RUBRIC, "route": "page", "reviewers": ["alice"], **over}


def test_staff_who_can_read_the_writers_records_in_the_admin_cannot_be_assigned(world):
    alice = world.users["alice"]
    alice.is_staff = True
    alice.save(update_fields=["is_staff"])
    alice.user_permissions.add(perm("view_checkpoint"))
    before = snapshot()
    resp = world.writer_api.post(f"/sessions/{world.writer.id}/review-gates", gate_body(world))
    assert resp.status_code == 403, resp.content
    err = resp.json()["error"]
    assert err["code"] == "independence_violation"
    assert err["details"] == {"field": "reviewers[0]", "reason": "staff"}
    assert "admin" in err["message"]
    assert snapshot() == before
