"""Signed webhooks per project (docs/webhooks.md): register, list, read, rotate, deactivate,
delete, redeliver. Every route needs the ``manage`` permission and a token not bound to one
session (an endpoint receives the whole project's events)."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status

from novelforge_sessions.access import Caller
from novelforge_sessions.apikit.common import caller, errors
from novelforge_sessions.api.schemas import EventTypeName
from novelforge_sessions.apikit.schemas import Strict
from novelforge_sessions.errors import Forbidden
from novelforge_sessions.lifecycles import DeliveryState
from novelforge_sessions.webhooks import endpoints as hooks
from novelforge_sessions.webhooks.models import MAX_DESCRIPTION, MAX_EVENT_TYPES, MAX_URL, WebhookDelivery

router = Router(tags=["webhooks"])

#: Deliveries shown with an endpoint (newest first).
RECENT_DELIVERIES = 20


class WebhookIn(Strict):
    url: str = Field(..., min_length=1, max_length=MAX_URL,
                     description="http(s) URL; its host must resolve to public addresses only (WEBHOOK_ALLOW_PRIVATE)")
    event_types: list[EventTypeName | Literal["*"]] = Field(
        ..., min_length=1, max_length=MAX_EVENT_TYPES, description='event type names of the catalog, or "*" for every one',
    )
    description: str = Field("", max_length=MAX_DESCRIPTION)


class WebhookActiveIn(Strict):
    active: bool


class WebhookDeliveryOut(Schema):
    id: int
    event_id: int
    event_type: str
    webhook_id: str = Field(..., description="the `webhook-id` header: the same on every attempt")
    state: str = Field(..., description="pending, delivered or failed (docs/lifecycles.md)")
    attempts: int
    next_attempt_at: datetime | None = Field(..., description="when the next attempt is due (pending only)")
    last_attempt_at: datetime | None
    last_status: int | None = Field(..., description="the endpoint's HTTP status at the last attempt")
    last_latency_ms: int | None
    last_error: str
    delivered_at: datetime | None

    @staticmethod
    def resolve_next_attempt_at(obj: WebhookDelivery) -> datetime | None:
        return obj.next_attempt_at if obj.state == DeliveryState.PENDING else None


class WebhookOut(Schema):
    id: int
    url: str
    description: str
    event_types: list[str]
    active: bool
    created_at: datetime
    previous_secret_expires_at: datetime | None = Field(
        ..., description="after a rotation: until when the previous secret still signs (a second signature)")


class WebhookDetailOut(WebhookOut):
    recent_deliveries: list[WebhookDeliveryOut]


class WebhookSecretOut(WebhookOut):
    secret: str = Field(..., description="`whsec_…`: shown only in this answer; keep it to verify signatures")


def _manager(request: HttpRequest) -> Caller:
    who = caller(request)
    who.require("manage")
    if who.session_id is not None:
        raise Forbidden("a token bound to one session cannot manage the project's webhooks", permission="manage")
    return who


@router.post("/webhooks", response={201: WebhookSecretOut, **errors(403)},
             summary="Register a webhook endpoint (its secret is in this answer only)")
def create_webhook(request: HttpRequest, body: WebhookIn):
    who = _manager(request)
    endpoint, _secret = hooks.create_endpoint(who.single_project(), url=body.url, event_types=list(body.event_types),
                                             description=body.description, actor=who.label)
    return Status(201, endpoint)  # WebhookSecretOut: the one answer that carries the secret


@router.get("/webhooks", response={200: list[WebhookOut], **errors(403)}, summary="The project's webhook endpoints")
def list_webhooks(request: HttpRequest):
    who = _manager(request)
    return list(hooks.endpoints_of(who.project_ids).order_by("id")[:500])


@router.get("/webhooks/{webhook_id}", response={200: WebhookDetailOut, **errors(403, 404)},
            summary="A webhook endpoint and its recent deliveries (status, latency, next retry)")
def get_webhook(request: HttpRequest, webhook_id: int):
    who = _manager(request)
    endpoint = hooks.get_endpoint(who.project_ids, webhook_id)
    endpoint.recent_deliveries = list(endpoint.deliveries.order_by("-id")[:RECENT_DELIVERIES])
    return endpoint


@router.post("/webhooks/{webhook_id}/rotate", response={200: WebhookSecretOut, **errors(403, 404)},
             summary="A new secret (in this answer only); the previous one still signs during the overlap")
def rotate_webhook_secret(request: HttpRequest, webhook_id: int):
    who = _manager(request)
    endpoint, _secret = hooks.rotate_secret(who.project_ids, webhook_id)
    return endpoint


@router.post("/webhooks/{webhook_id}/active", response={200: WebhookOut, **errors(403, 404)},
             summary="Deactivate (or reactivate) an endpoint: no new deliveries while inactive")
def set_webhook_active(request: HttpRequest, webhook_id: int, body: WebhookActiveIn):
    who = _manager(request)
    return hooks.set_active(who.project_ids, webhook_id, body.active)


@router.delete("/webhooks/{webhook_id}", response={204: None, **errors(403, 404)},
               summary="Delete an endpoint and its deliveries")
def delete_webhook(request: HttpRequest, webhook_id: int):
    who = _manager(request)
    hooks.delete_endpoint(who.project_ids, webhook_id)
    return Status(204, None)


@router.post("/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver", response={200: WebhookDeliveryOut, **errors(403, 404)},
             summary="Send a delivery again now (same webhook-id, a fresh 24-hour window); a delivered one is repeated by a new delivery")
def redeliver_webhook(request: HttpRequest, webhook_id: int, delivery_id: int):
    who = _manager(request)
    return hooks.redeliver(who.project_ids, webhook_id, delivery_id)
