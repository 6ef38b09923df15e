"""The webhook API (docs/webhooks.md#registering-an-endpoint): the ``manage`` permission, typed
refusals that write nothing, the secret shown once, private addresses, declared limits."""
from __future__ import annotations

import pytest

from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.webhooks.models import MAX_EVENT_TYPES, MAX_URL, WebhookDelivery, WebhookEndpoint
from tests.support.factories import Api
from tests.webhooks.conftest import register

pytestmark = pytest.mark.django_db

PUBLIC_URL = "http://93.184.216.34/hooks"  # a literal public address: no DNS needed


def test_a_token_without_manage_is_refused_and_nothing_is_written(project, owner, manager, allow_private):
    write_only = Api(create_token(project, name="writer", permissions=["write"])[1])
    hook = register(manager, PUBLIC_URL, ["*"])
    before = WebhookEndpoint.objects.values_list("id", "secret", "url", "active").get()
    for api in (write_only, Api(create_token(project, name="rw", permissions=["read", "write", "approve"])[1])):
        assert api.post("/webhooks", {"url": PUBLIC_URL, "event_types": ["*"]}).status_code == 403
        for resp in (api.get("/webhooks"), api.get(f"/webhooks/{hook['id']}"), api.post(f"/webhooks/{hook['id']}/rotate"),
                     api.post(f"/webhooks/{hook['id']}/active", {"active": False}), api.delete(f"/webhooks/{hook['id']}")):
            assert resp.status_code == 403, resp.content
            assert resp.json()["error"]["code"] == "forbidden" and resp.json()["error"]["details"] == {"permission": "manage"}
    assert list(WebhookEndpoint.objects.values_list("id", "secret", "url", "active")) == [before]


def test_a_session_bound_token_cannot_manage_webhooks(project, new_session):
    session = new_session()
    from novelforge_sessions.models import Session

    _, raw = create_token(project, name="bound", permissions=["manage", "read"], session=Session.objects.get(id=session["id"]))
    resp = Api(raw).post("/webhooks", {"url": PUBLIC_URL, "event_types": ["*"]})
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "forbidden"
    assert not WebhookEndpoint.objects.exists()


def test_register_list_get_rotate_deactivate_delete(project, manager, outsider):
    created = manager.post("/webhooks", {"url": PUBLIC_URL, "event_types": ["review.gate_opened", "review.verdict_bound"],
                                         "description": "gates"})
    assert created.status_code == 201, created.content
    hook = created.json()
    assert hook["secret"].startswith("whsec_") and hook["event_types"] == ["review.gate_opened", "review.verdict_bound"]
    assert WebhookEndpoint.objects.get().secret == hook["secret"]
    listed = manager.get("/webhooks").json()
    assert [h["id"] for h in listed] == [hook["id"]] and "secret" not in listed[0]
    detail = manager.get(f"/webhooks/{hook['id']}").json()
    assert "secret" not in detail and detail["recent_deliveries"] == [] and detail["previous_secret_expires_at"] is None
    # Another project's token sees none of it.
    assert outsider.get(f"/webhooks/{hook['id']}").status_code == 404 and outsider.get("/webhooks").json() == []
    rotated = manager.post(f"/webhooks/{hook['id']}/rotate").json()
    stored = WebhookEndpoint.objects.get()
    assert rotated["secret"] == stored.secret != hook["secret"] and stored.previous_secret == hook["secret"]
    assert manager.post(f"/webhooks/{hook['id']}/active", {"active": False}).json()["active"] is False
    assert WebhookEndpoint.objects.get().active is False
    assert manager.delete(f"/webhooks/{hook['id']}").status_code == 204
    assert not WebhookEndpoint.objects.exists()
    missing = manager.get(f"/webhooks/{hook['id']}")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_another_projects_endpoint_is_not_found(project, other_project, manager):
    _, raw = create_token(other_project, name="theirs", permissions=["manage"])
    theirs = Api(raw)
    hook = register(theirs, PUBLIC_URL, ["*"])
    for resp in (manager.get(f"/webhooks/{hook['id']}"), manager.post(f"/webhooks/{hook['id']}/rotate"),
                 manager.delete(f"/webhooks/{hook['id']}"),
                 manager.post(f"/webhooks/{hook['id']}/deliveries/1/redeliver")):
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found", resp.content
    assert manager.get("/webhooks").json() == []
    assert WebhookEndpoint.objects.get().secret == hook["secret"]


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9/hook", "http://localhost/hook", "http://10.1.2.3/hook", "http://192.168.0.10/hook",
    "http://169.254.169.254/latest/meta-data", "http://[::1]/hook", "http://[fe80::1]/hook", "http://0.0.0.0/hook",
    "http://[::ffff:127.0.0.1]/hook",
])
def test_a_private_loopback_or_link_local_address_is_refused_unless_allowed(manager, settings, url):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    resp = manager.post("/webhooks", {"url": url, "event_types": ["*"]})
    assert resp.status_code == 422, resp.content
    assert resp.json()["error"]["code"] == "webhook_url_refused" and resp.json()["error"]["details"]["field"] == "url"
    assert not WebhookEndpoint.objects.exists()
    if "fe80" in url or "0.0.0.0" in url:
        return  # not a destination one allows on purpose
    settings.WEBHOOK_ALLOW_PRIVATE = True
    assert manager.post("/webhooks", {"url": url, "event_types": ["*"]}).status_code == 201


@pytest.mark.parametrize("body, code", [
    ({"url": "ftp://93.184.216.34/x", "event_types": ["*"]}, "webhook_url_refused"),
    ({"url": "http://user:pw@93.184.216.34/x", "event_types": ["*"]}, "webhook_url_refused"),
    ({"url": "http://no-such-host.invalid/x", "event_types": ["*"]}, "webhook_url_refused"),
    ({"url": PUBLIC_URL, "event_types": ["session.nope"]}, "validation_error"),
    ({"url": PUBLIC_URL, "event_types": []}, "validation_error"),
    ({"url": PUBLIC_URL, "event_types": ["*"] * (MAX_EVENT_TYPES + 1)}, "validation_error"),
    ({"url": PUBLIC_URL + "/" + "a" * MAX_URL, "event_types": ["*"]}, "validation_error"),
    ({"url": PUBLIC_URL, "event_types": ["*"], "secret": "whsec_mine"}, "validation_error"),
])
def test_bad_registrations_are_refused_with_typed_errors_and_nothing_is_written(manager, body, code):
    resp = manager.post("/webhooks", body)
    assert resp.status_code == 422, resp.content
    assert resp.json()["error"]["code"] == code
    assert not WebhookEndpoint.objects.exists()


def test_redeliver_of_an_unknown_delivery_is_not_found(manager):
    hook = register(manager, PUBLIC_URL, ["*"])
    resp = manager.post(f"/webhooks/{hook['id']}/deliveries/999999/redeliver")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert not WebhookDelivery.objects.exists()


def test_openapi_declares_the_limits_and_the_manage_routes(client):
    schema = client.get("/api/openapi.json").json()
    body = schema["components"]["schemas"]["WebhookIn"]["properties"]
    assert body["url"]["maxLength"] == MAX_URL
    assert body["event_types"]["maxItems"] == MAX_EVENT_TYPES and body["event_types"]["minItems"] == 1
    paths = schema["paths"]
    assert {"/api/v1/webhooks", "/api/v1/webhooks/{webhook_id}", "/api/v1/webhooks/{webhook_id}/rotate",
            "/api/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver"} <= set(paths)
    assert "201" in paths["/api/v1/webhooks"]["post"]["responses"]
