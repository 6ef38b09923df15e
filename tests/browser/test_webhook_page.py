"""The manager's webhook page in headless Chromium against a real daphne (docs/webhooks.md#the-managers-page):
a manager registers an endpoint (its secret shown once), sees its attempts (status, latency, next
retry) as the sender makes them to a real loopback receiver that verifies every signature, and
redelivers one, which arrives again with the same webhook-id."""
from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import expect

from novelforge_sessions.actions import sessions
from novelforge_sessions.models import Membership
from novelforge_sessions.webhooks.models import WebhookDelivery, WebhookEndpoint
from novelforge_sessions.webhooks.sender import run_once
from tests.browser.a11y import assert_no_serious_a11y_violations
from tests.browser.conftest import login, screenshot
from tests.support.factories import caller_for, make_project
from tests.support.servers import DaphneServer
from tests.webhooks.receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "hooks-for-the-harbour"


@pytest.fixture(scope="module")
def hook_server(django_db_setup, django_db_blocker):
    """The receiver is on loopback: this server allows private webhook addresses (docs/webhooks.md#private-addresses)."""
    srv = DaphneServer(extra_env={"WEBHOOK_ALLOW_PRIVATE": "true"})
    yield srv
    srv.stop()


@pytest.fixture
def receiver():
    r = Receiver().start()
    yield r
    r.stop()


def new_session(project) -> int:
    spec = sessions.NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli")
    return sessions.create_session(caller_for(project), spec).id


def test_a_manager_registers_an_endpoint_sees_its_attempts_and_redelivers_one(page, hook_server, receiver, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True  # the sender runs in this process
    project = make_project("harbour", name="The Harbour")
    user = get_user_model().objects.create_user("nell", password=PASSWORD)
    Membership.objects.create(user=user, project=project, role=Membership.Role.MANAGER)
    other = make_project("elsewhere")
    login(page, hook_server, "nell", PASSWORD)

    page.goto(f"{hook_server.url}/projects/{project.id}/")
    page.get_by_role("link", name="Webhooks →").click()
    expect(page.get_by_role("heading", name="Webhooks", exact=True)).to_be_visible()
    assert_no_serious_a11y_violations(page, "webhooks")
    page.get_by_label("URL").fill(receiver.url)
    page.get_by_label("Description (optional)").fill("relay to the team chat")
    page.get_by_role("checkbox", name="session.created").check()
    page.get_by_role("button", name="Register").click()

    expect(page.get_by_role("heading", name="Endpoint registered")).to_be_visible()
    secret = page.locator("[data-field=secret]").inner_text().strip()
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/=]+", secret)
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.project_id == project.id and endpoint.event_types == ["session.created"]
    assert endpoint.secret == secret
    screenshot(page, "webhook-secret")
    page.get_by_role("link", name="Go to the endpoint").click()
    assert secret not in page.content(), "the secret is shown once, never on the endpoint's page"
    expect(page.get_by_text("No attempt yet")).to_be_visible()

    # An event of the subscribed type; the receiver fails its first attempt (500).
    receiver.secrets = [secret]
    receiver.fail_first = 1
    session_id = new_session(project)
    new_session(other)  # another project's event: never sent here
    assert run_once()["attempts"] == 1
    page.reload()
    row = page.locator("tr[data-delivery-id]")
    expect(row).to_have_count(1)
    expect(row.locator(".delivery-state")).to_have_text("Pending")
    expect(row).to_contain_text("500")
    expect(row).to_contain_text(" ms")
    delivery = WebhookDelivery.objects.get()
    expect(row).to_contain_text(timezone.localtime(delivery.next_attempt_at).strftime("%Y-%m-%d %H:%M"))  # the next retry
    assert_no_serious_a11y_violations(page, "webhook")

    # Redeliver now instead of waiting for the backoff: delivered, same webhook-id.
    row.get_by_role("button", name=f"Redeliver delivery {delivery.id}").click()
    expect(page.get_by_text(f"Delivery {delivery.id} is sent again")).to_be_visible()
    assert run_once()["delivered"] == 1
    page.reload()
    expect(row.locator(".delivery-state")).to_have_text("Delivered")
    expect(row.locator(".delivery-attempts")).to_have_text("2")
    screenshot(page, "webhook-attempts")

    # A delivered one can be redelivered too (a receiver that lost it): a new delivery of the same
    # event with the same webhook-id, listed first; the delivered one stays as it was.
    row.get_by_role("button", name=f"Redeliver delivery {delivery.id}").click()
    rows = page.locator("tr[data-delivery-id]")
    expect(rows).to_have_count(2)
    repeat = WebhookDelivery.objects.exclude(id=delivery.id).get()
    assert repeat.redelivery_of_id == delivery.id and repeat.webhook_id == delivery.webhook_id
    expect(rows.first.locator(".delivery-state")).to_have_text("Pending")
    expect(rows.first).to_contain_text(f"repeats {delivery.id}")
    assert run_once()["delivered"] == 1
    page.reload()
    expect(rows.first.locator(".delivery-state")).to_have_text("Delivered")
    expect(rows.nth(1).locator(".delivery-state")).to_have_text("Delivered")
    expect(rows.nth(1).locator(".delivery-attempts")).to_have_text("2")
    assert [r.status for r in receiver.received] == [500, 200, 200]
    assert {r.webhook_id for r in receiver.received} == {delivery.webhook_id}
    assert all(r.verified_by == [secret] for r in receiver.received)
    assert {r.json["data"]["session_id"] for r in receiver.received} == {session_id}


def test_another_projects_manager_gets_404_and_a_form_without_csrf_is_refused(page, hook_server):
    mine = make_project("mine")
    theirs = make_project("theirs")
    user = get_user_model().objects.create_user("ola", password=PASSWORD)
    Membership.objects.create(user=user, project=mine, role=Membership.Role.MANAGER)
    login(page, hook_server, "ola", PASSWORD)
    assert page.goto(f"{hook_server.url}/projects/{theirs.id}/webhooks/").status == 404
    resp = page.request.post(f"{hook_server.url}/projects/{mine.id}/webhooks/",
                             form={"url": "https://hooks.example.org/x", "event_types": "session.created"})
    assert resp.status == 403
    assert not WebhookEndpoint.objects.exists()
