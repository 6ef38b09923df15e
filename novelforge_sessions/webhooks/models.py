"""Webhook endpoints, their deliveries, and the sender's cursor in the event log (docs/webhooks.md)."""
from __future__ import annotations

from django.db import models
from django.db.models import Q

from novelforge_sessions.lifecycles import DeliveryState
from novelforge_sessions.models import Project, text_choices

#: Limits the API declares (and the database keeps).
MAX_URL = 2000
MAX_EVENT_TYPES = 50
MAX_DESCRIPTION = 200


class WebhookEndpoint(models.Model):
    """Where a project's events go: a URL, the event types it wants (catalog names or ``*``), and
    the secret its deliveries are signed with.

    The secret is stored as it is handed out (``whsec_…``): signing needs it, so it cannot be
    hashed like a token. The API shows it once, at creation and at rotation. After a rotation
    the previous secret keeps signing beside the new one until ``previous_secret_expires_at``.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.CharField(max_length=MAX_URL)
    description = models.CharField(max_length=MAX_DESCRIPTION, blank=True, default="")
    event_types = models.JSONField(default=list)
    secret = models.CharField(max_length=100)
    previous_secret = models.CharField(max_length=100, blank=True, default="")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    active = models.BooleanField(default=True)
    #: Events with ids up to this one were visible when the endpoint was registered: it gets only later ones.
    start_after_event_id = models.BigIntegerField(default=0)
    created_by = models.CharField(max_length=200, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["project", "id"], name="webhook_endpoint_project")]

    def wants(self, event_type: str) -> bool:
        return "*" in self.event_types or event_type in self.event_types


class WebhookDelivery(models.Model):
    """One event for one endpoint: at least once, retried with backoff until ``expires_at``.

    ``webhook_id`` (the ``webhook-id`` header) is fixed when the row is made, so every retry of
    the same event to the same endpoint carries the same id (receivers deduplicate on it).
    ``leased_until``: an attempt in flight (claimed by one sender); nobody else claims the row
    before it passes, so two senders never make the same attempt twice at once.
    """

    State = text_choices("DeliveryState", DeliveryState)

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.BigIntegerField()
    event_type = models.CharField(max_length=64)
    webhook_id = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    leased_until = models.DateTimeField(null=True, blank=True)
    lease_token = models.CharField(max_length=32, blank=True, default="")
    expires_at = models.DateTimeField()
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveIntegerField(null=True, blank=True)
    last_latency_ms = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    #: A delivered delivery sent again on request is a new row of the same event and ``webhook_id``
    #: pointing at the one it repeats (the delivered one stays as it was: ``delivered`` is terminal).
    redelivery_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE,
                                      related_name="redeliveries")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # The sender's claim: due pending rows, oldest first.
            models.Index(fields=["next_attempt_at"], condition=Q(state=DeliveryState.PENDING), name="webhook_delivery_due"),
            models.Index(fields=["endpoint", "-id"], name="webhook_delivery_endpoint"),
        ]
        constraints = [
            # One per event and endpoint from the log's scan (ON CONFLICT DO NOTHING); redeliveries aside.
            models.UniqueConstraint(fields=["endpoint", "event_id"], condition=Q(redelivery_of__isnull=True),
                                    name="webhook_delivery_one_per_event"),
            models.CheckConstraint(condition=Q(state__in=[s.value for s in DeliveryState]), name="webhook_delivery_state_enum"),
        ]


class WebhookCursor(models.Model):
    """The sender's place in the event log: every event up to ``last_event_id`` has been matched
    against the endpoints (one row, ``id=1``; senders take it in turn, ``FOR UPDATE``)."""

    last_event_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)
