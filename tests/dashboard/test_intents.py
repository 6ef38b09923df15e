"""Project page: write intents awaiting approval, approved or refused by the project's manager
(POST + CSRF, the existing approval actions, 404 for anyone else), closed ones folded; and
the link to the reviewer calibration view."""
from __future__ import annotations

import re

import pytest

from novelforge_sessions.control import intents
from novelforge_sessions.actions.artifacts import add_artifact_version, create_artifact
from novelforge_sessions.errors import IntentNotExecutable
from novelforge_sessions.control.models import Approval, WriteIntent
from novelforge_sessions.models import Event, Membership, Project
from reviews import actions as review_actions
from reviews.access import reviewer_for_user
from reviews.models import Verdict
from tests.support.factories import caller_for
from tests.dashboard.conftest import csrf_token, logged_in, make_user
from tests.reviews.factories import make_world, verdict_for
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db


def propose(project: Project, key: str = "make-v2-current", name: str = "chapter-2") -> WriteIntent:
    """An agent proposes making v2 of a fresh artifact current (v1 is)."""
    agent = caller_for(project)
    artifact = create_artifact(agent, name=name, kind="chapter", content="first draft")
    v2 = add_artifact_version(agent, artifact.id, content="second draft")
    before = intents.read_before_state(agent, kind="artifact.make_current", artifact_id=artifact.id)
    return intents.create_intent(
        agent, kind="artifact.make_current", idempotency_key=key, before_fingerprint=before.fingerprint,
        params={"version_id": v2.id}, artifact_id=artifact.id,
    ).intent


def settle(project: Project) -> WriteIntent:
    agent = caller_for(project)
    artifact = create_artifact(agent, name="canon", kind="canon", content="the bible")
    before = intents.read_before_state(agent, kind="authority.settle")
    return intents.create_intent(
        agent, kind="authority.settle", idempotency_key="settle-1", before_fingerprint=before.fingerprint,
        params={"artifacts": [{"artifact_id": artifact.id, "fingerprint": artifact.current_version.fingerprint}]},
    ).intent


def article(html: str, intent: WriteIntent) -> str:
    match = re.search(rf'<article class="intent[^"]*" id="intent-{intent.id}".*?</article>', html, re.S)
    assert match, f"intent {intent.id} is not on the page"
    return match.group(0)


def post(client, project: Project, intent: WriteIntent, decision: str, **data):
    token = csrf_token(client, f"/projects/{project.id}/")
    return client.post(f"/projects/{project.id}/intents/{intent.id}/{decision}/", {"csrfmiddlewaretoken": token, **data})


def test_open_intents_are_listed_with_what_they_would_change(mgr_client, project):
    intent = propose(project)
    html = mgr_client.get(f"/projects/{project.id}/").content.decode()
    card = article(html, intent)
    assert 'data-state="proposed"' in card and "artifact.make_current" in card
    assert "chapter-2: make v2 current (was v1)" in card
    fp = intent.before_fingerprint
    assert f"{fp[:11]}…{fp[-4:]}" in card and f'data-copy="{fp}"' in card
    assert "test:novel" in card and "<time" in card, "requested by, and its age"
    assert "Needs an approval." in card
    assert re.search(r'<button type="submit" class="primary" name="decision" value="approve"\s+aria-label', card), "enabled"
    assert f'formaction="/projects/{project.id}/intents/{intent.id}/refuse/"' in card
    assert "csrfmiddlewaretoken" in card
    assert 'data-field="open-intents">1<' in html and "No write intent is waiting." not in html


def test_the_manager_approves_through_the_approval_action(mgr_client, manager, project):
    intent = propose(project)
    resp = post(mgr_client, project, intent, "approve", note="reads well")
    assert resp.status_code == 302 and resp["Location"] == f"/projects/{project.id}/#write-intents"
    intent.refresh_from_db()
    assert intent.state == "approved"
    approval = Approval.objects.get(intent=intent)
    assert (approval.decision, approval.approver, approval.approver_user_id, approval.note) == (
        "approved", "user:manager", manager.id, "reads well")
    assert approval.before_fingerprint == intent.before_fingerprint
    assert Event.objects.filter(type="write_intent.approved", payload__intent_id=intent.id).count() == 1
    # Now it waits for the agent; the page says so and offers no second approval.
    html = mgr_client.get(f"/projects/{project.id}/").content.decode()
    card = article(html, intent)
    assert "Approved: waiting for the agent to execute it." in card and "by user:manager" not in card
    assert "Approved by</dt><dd>user:manager" in card and "“reads well”" in card
    assert re.search(r'value="approve" disabled', card)
    assert "Approved write intent" in html, "the outcome is reported"


def test_the_manager_refuses_and_the_intent_folds_away(mgr_client, project):
    intent = propose(project)
    resp = post(mgr_client, project, intent, "refuse", note="wrong chapter")
    assert resp.status_code == 302
    intent.refresh_from_db()
    assert intent.state == "rejected"
    assert Approval.objects.get(intent=intent).decision == "rejected"
    with pytest.raises(IntentNotExecutable):  # closed: the action refuses any later approval
        intents.approve_intent(caller_for(project), intent.id)
    html = mgr_client.get(f"/projects/{project.id}/").content.decode()
    assert "No write intent is waiting." in html
    folded = re.search(r'<details class="intents-closed".*?</details>', html, re.S).group(0)
    card = article(folded, intent)
    assert 'data-state="rejected"' in card and "Refused by</dt><dd>user:manager" in card
    assert "<form" not in card, "closed intents take no decision"


@pytest.mark.parametrize("decision", ["approve", "refuse"])
def test_a_note_the_database_cannot_store_is_refused_in_plain_words(mgr_client, project, decision):
    """A NUL in the decision's note reached PostgreSQL from the page (a 500). The
    approval actions refuse text they cannot store themselves (the API's edge check is only the
    first of two), the page reports it in plain words, and nothing is written."""
    intent = propose(project)
    before = snapshot()
    resp = post(mgr_client, project, intent, decision, note="reads\x00 well")
    assert resp.status_code == 302 and snapshot() == before
    html = mgr_client.get(f"/projects/{project.id}/").content.decode()
    assert "Nothing was changed: the note contains a character that cannot be saved (a NUL character, U+0000)" in html


@pytest.mark.parametrize("note", ["a\x00b", "half a pair \ud800"])
def test_the_approval_actions_refuse_unstorable_notes_for_every_caller(project, note):
    from novelforge_sessions.errors import ValidationFailed

    intent = propose(project)
    who = caller_for(project)
    for act in (intents.approve_intent, intents.reject_intent):
        before = snapshot()
        with pytest.raises(ValidationFailed) as info:
            act(who, intent.id, note=note)
        assert info.value.details == {"field": "note"} and snapshot() == before
    intents.approve_intent(who, intent.id, note="fine")
    before = snapshot()
    with pytest.raises(ValidationFailed):
        intents.revoke_approval(who, intent.id, note=note)
    assert snapshot() == before


def test_executed_intents_show_their_after_state(mgr_client, project):
    intent = propose(project)
    intents.approve_intent(caller_for(project), intent.id)
    intents.execute_intent(caller_for(project), intent.id)
    html = mgr_client.get(f"/projects/{project.id}/").content.decode()
    card = article(re.search(r'<details class="intents-closed".*?</details>', html, re.S).group(0), intent)
    intent.refresh_from_db()
    assert 'data-state="executed"' in card and f'data-copy="{intent.after_fingerprint}"' in card
    assert "post-condition held" in card


def test_a_stale_before_state_cannot_be_approved_from_the_page(mgr_client, project):
    intent = settle(project)
    Project.objects.filter(id=project.id).update(authority_version=2)  # another write moved the authority
    card = article(mgr_client.get(f"/projects/{project.id}/").content.decode(), intent)
    assert "stale" in card.split(">", 1)[0] and "can no longer be approved" in card
    assert re.search(r'value="approve" disabled', card) and not re.search(r'value="refuse"[^>]*disabled', card)
    assert "settle 1 artifact version as authority v2" in card
    # Posting anyway is refused by the action, reported, and nothing changes.
    before = snapshot()
    resp = post(mgr_client, project, intent, "approve")
    assert resp.status_code == 302 and snapshot() == before
    assert "stale_precondition" in mgr_client.get(f"/projects/{project.id}/").content.decode()


def test_a_stale_approval_asks_for_approval_again(mgr_client, project):
    intent = propose(project)
    intents.approve_intent(caller_for(project), intent.id)
    Project.objects.filter(id=project.id).update(authority_version=5)
    card = article(mgr_client.get(f"/projects/{project.id}/").content.decode(), intent)
    assert "The approval is stale: the project&#x27;s authority moved since it was given." in card
    assert not re.search(r'value="approve" disabled', card)
    post(mgr_client, project, intent, "approve")
    assert Approval.objects.filter(intent=intent, revoked_at__isnull=True).get().authority_version == 5


@pytest.mark.parametrize("decision", ["approve", "refuse"])
def test_without_csrf_nothing_happens(mgr_client, project, decision):
    intent = propose(project)
    before = snapshot()
    assert mgr_client.post(f"/projects/{project.id}/intents/{intent.id}/{decision}/").status_code == 403
    assert snapshot() == before


@pytest.mark.parametrize("decision", ["approve", "refuse"])
def test_only_a_manager_of_that_project_decides(other_manager, project, other_project, decision):
    intent = propose(project)
    theirs = propose(other_project)
    before = snapshot()
    client = logged_in(other_manager, csrf=True)
    # Their own project's URL with our intent id, and our project's URL: both 404.
    assert post(client, other_project, intent, decision).status_code == 404
    token = client.cookies["csrftoken"].value
    resp = client.post(f"/projects/{project.id}/intents/{intent.id}/{decision}/", {"csrfmiddlewaretoken": token})
    assert resp.status_code == 404
    assert snapshot() == before
    reviewer = make_user("reviewer", project, role=Membership.Role.REVIEWER)
    before = snapshot()
    client = logged_in(reviewer, csrf=True)
    token = csrf_token(client, "/reviews/")
    resp = client.post(f"/projects/{project.id}/intents/{intent.id}/{decision}/", {"csrfmiddlewaretoken": token})
    assert resp.status_code == 404
    assert snapshot() == before
    assert WriteIntent.objects.get(id=theirs.id).state == "proposed"


def test_decisions_are_post_only_and_need_a_login(mgr_client, project):
    from django.test import Client

    intent = propose(project)
    assert mgr_client.get(f"/projects/{project.id}/intents/{intent.id}/approve/").status_code == 405
    resp = Client().post(f"/projects/{project.id}/intents/{intent.id}/approve/")
    assert resp.status_code == 302 and resp["Location"].startswith("/login/")
    assert WriteIntent.objects.get(id=intent.id).state == "proposed"


def test_the_project_page_links_the_calibration_view(mgr_client, project):
    world = make_world(project)
    gate = world.gate(route="page", reviewers=["alice"])
    review_actions.bind_verdict(reviewer_for_user(world.users["alice"]), gate.packet.id, verdict_for(gate),
                                channel=Verdict.Channel.PAGE)
    html = mgr_client.get(f"/projects/{project.id}/").content.decode()
    card = re.search(r'<section class="card" id="reviewer-calibration">.*?</section>', html, re.S).group(0)
    assert 'href="/reviews/calibration/"' in card
    assert "<strong>1</strong> review gate<" in card and "<strong>1</strong> verdict bound" in card
    assert "<strong>0</strong> waiting" in card
    assert mgr_client.get("/reviews/calibration/").status_code == 200


def test_project_page_queries_do_not_grow_with_the_intents(mgr_client, project):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert mgr_client.get(f"/projects/{project.id}/").status_code == 200
        return len(ctx.captured_queries)

    propose(project, key="k-0", name="a-0")
    small = queries()
    for n in range(1, 4):
        intent = propose(project, key=f"k-{n}", name=f"a-{n}")
        if n == 2:
            intents.approve_intent(caller_for(project), intent.id)
    assert queries() == small
