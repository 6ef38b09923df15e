"""The writes behind the webhook API: register, rotate, delete, redeliver (docs/webhooks.md).

Each is one short transaction of its own; none touches the event log or the write path of
sessions. Refusals write nothing.
"""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from novelforge_sessions import events
from novelforge_sessions import lifecycles as lc
from novelforge_sessions.actions.lifecycle import move
from novelforge_sessions.lifecycles import DeliveryState
from novelforge_sessions.errors import NotFound, ValidationFailed, WebhookUrlRefused
from novelforge_sessions.event_types import CATALOG
from novelforge_sessions.models import Project
from novelforge_sessions.phrases import Phrase, gettext_noop
from novelforge_sessions.webhooks import addresses, signing
from novelforge_sessions.webhooks.models import MAX_EVENT_TYPES, MAX_URL, WebhookDelivery, WebhookEndpoint

ANY_EVENT = "*"

#: The kinds of notice people ask for, and the catalog's event type of each (docs/webhooks.md#event-types).
NAMED_KINDS = {
    "gate opened": "review.gate_opened",
    "verdict bound": "review.verdict_bound",
    "approval requested": "write_intent.created",  # with "requires_approval": true in its payload
    "session failed": "session.transitioned",  # with "to": "failed" in its payload
    "conflict opened": "handoff.result_conflict",
    "handoff waiting too long": "handoff.waiting_long",  # HANDOFF_LONG_WAIT_SECONDS
}


def check_event_types(event_types: list[str]) -> list[str]:
    if not event_types:
        raise ValidationFailed(Phrase(gettext_noop("name at least one event type, or \"*\" for every one")), field="event_types")
    if len(event_types) > MAX_EVENT_TYPES:
        raise ValidationFailed(Phrase(gettext_noop("at most %(n)s event types"), n=MAX_EVENT_TYPES), field="event_types")
    unknown = sorted({t for t in event_types if t != ANY_EVENT and t not in CATALOG})
    if unknown:
        raise ValidationFailed(Phrase(gettext_noop("unknown event types")), field="event_types", unknown=unknown)
    return sorted(set(event_types))


def check_url(url: str) -> str:
    if len(url) > MAX_URL:
        raise ValidationFailed(Phrase(gettext_noop("a webhook URL is at most %(n)s characters"), n=MAX_URL), field="url")
    try:
        addresses.resolve(url)
    except addresses.Refused as exc:
        raise WebhookUrlRefused(exc.args[0], field="url") from None  # the reason itself: a phrase
    return url


def create_endpoint(project: Project, *, url: str, event_types: list[str], description: str = "",
                    actor: str = "") -> tuple[WebhookEndpoint, str]:
    """Register an endpoint; returns it and its secret (shown this once). It receives the events
    that become visible after this call, never earlier ones."""
    types = check_event_types(event_types)
    check_url(url)
    secret = signing.new_secret()
    endpoint = WebhookEndpoint.objects.create(
        project=project, url=url, event_types=types, description=description, secret=secret,
        start_after_event_id=events.latest_visible_id(), created_by=actor,
    )
    return endpoint, secret


def endpoints_of(project_ids) -> "WebhookEndpoint.objects":
    return WebhookEndpoint.objects.filter(project_id__in=project_ids)


def get_endpoint(project_ids, endpoint_id: int, *, lock: bool = False) -> WebhookEndpoint:
    qs = endpoints_of(project_ids)
    if lock:
        qs = qs.select_for_update()
    try:
        return qs.get(id=endpoint_id)
    except WebhookEndpoint.DoesNotExist:
        raise NotFound("webhook endpoint not found", id=endpoint_id) from None


def rotate_secret(project_ids, endpoint_id: int) -> tuple[WebhookEndpoint, str]:
    """A new secret (returned once); the current one keeps signing beside it for
    ``WEBHOOK_SECRET_OVERLAP_SECONDS``, so receivers can switch without losing a delivery."""
    with transaction.atomic():
        endpoint = get_endpoint(project_ids, endpoint_id, lock=True)
        secret = signing.new_secret()
        endpoint.previous_secret = endpoint.secret
        endpoint.previous_secret_expires_at = timezone.now() + timedelta(seconds=settings.WEBHOOK_SECRET_OVERLAP_SECONDS)
        endpoint.secret = secret
        endpoint.save(update_fields=["secret", "previous_secret", "previous_secret_expires_at"])
    return endpoint, secret


def set_active(project_ids, endpoint_id: int, active: bool) -> WebhookEndpoint:
    """An inactive endpoint gets no new deliveries and its pending ones wait (not lost)."""
    with transaction.atomic():
        endpoint = get_endpoint(project_ids, endpoint_id, lock=True)
        endpoint.active = active
        endpoint.save(update_fields=["active"])
    return endpoint


def delete_endpoint(project_ids, endpoint_id: int) -> None:
    endpoint = get_endpoint(project_ids, endpoint_id)
    endpoint.delete()  # its deliveries go with it


def redeliver(project_ids, endpoint_id: int, delivery_id: int) -> WebhookDelivery:
    """Send a delivery again now (same ``webhook-id``), with a fresh retry window: a failed one (or
    a pending one sooner) moves back to ``pending``; a delivered one, whose receiver lost it, stays
    ``delivered`` and a new delivery of the same event repeats it (returned)."""
    now = timezone.now()
    with transaction.atomic():
        endpoint = get_endpoint(project_ids, endpoint_id)
        try:
            delivery = WebhookDelivery.objects.select_for_update().get(id=delivery_id, endpoint=endpoint)
        except WebhookDelivery.DoesNotExist:
            raise NotFound("webhook delivery not found", id=delivery_id) from None
        if delivery.state == DeliveryState.DELIVERED:
            return WebhookDelivery.objects.create(
                endpoint=endpoint, event_id=delivery.event_id, event_type=delivery.event_type,
                webhook_id=delivery.webhook_id, next_attempt_at=now,
                expires_at=now + timedelta(seconds=RETRY_WINDOW_SECONDS), redelivery_of=delivery,
            )
        move(delivery, lc.WEBHOOK_DELIVERY, DeliveryState.PENDING, next_attempt_at=now,
             expires_at=now + timedelta(seconds=RETRY_WINDOW_SECONDS))
    return delivery


def secrets_in_force(endpoint: WebhookEndpoint, now) -> list[str]:
    """The current secret, and the previous one while its overlap lasts."""
    keep_previous = endpoint.previous_secret and endpoint.previous_secret_expires_at and endpoint.previous_secret_expires_at > now
    return [endpoint.secret, endpoint.previous_secret] if keep_previous else [endpoint.secret]


#: A delivery is retried for this long after it was made (or redelivered), then it is ``failed``.
RETRY_WINDOW_SECONDS = 24 * 3600
