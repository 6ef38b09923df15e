"""Email notices, each person's preference, and the mailer's cursor (docs/notifications.md)."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from novelforge_sessions.models import Project


class EmailPreference(models.Model):
    """One person's email settings and batching state.

    ``email_enabled``: the opt-out, changed by the person on ``/notifications/``.
    ``last_mail_at``: when the last mail went to them; the next one waits until
    ``NOTIFY_BATCH_MINUTES`` later, and carries every notice made meanwhile.
    ``leased_until``/``lease_token``: a mailer is sending to this person (no other mailer takes
    them before it passes), or, after a failed send, when to try again.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="email_preference")
    email_enabled = models.BooleanField(default=True)
    last_mail_at = models.DateTimeField(null=True, blank=True)
    leased_until = models.DateTimeField(null=True, blank=True)
    lease_token = models.CharField(max_length=32, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)


class EmailNotice(models.Model):
    """Something waits for one person: made from one event, mailed (``sent_at``) in the person's
    next batch, or ``dropped_at`` when they opted out (or have no address) by then."""

    class Kind(models.TextChoices):
        REVIEW = "review"  # a review packet waits for this assigned reviewer
        APPROVAL = "approval"  # a write waits for a project approver (a manager)
        SESSION_FAILED = "session_failed"  # a session failed (managers)
        CONFLICT = "conflict"  # a late result conflicts with the consumed one (managers)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="email_notices")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    event_id = models.BigIntegerField()
    kind = models.CharField(max_length=20, choices=Kind.choices)
    #: The page that shows what waits (a path; the mail makes it absolute with ``NOTIFY_BASE_URL``).
    path = models.CharField(max_length=300)
    #: The packet, write intent or session the notice is about (named in the mail).
    subject_id = models.BigIntegerField()
    sent_at = models.DateTimeField(null=True, blank=True)
    dropped_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["user", "id"], condition=Q(sent_at__isnull=True, dropped_at__isnull=True),
                         name="email_notice_waiting"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["user", "event_id", "kind"], name="email_notice_one_per_event"),
        ]


class EmailCursor(models.Model):
    """The mailer's place in the event log (one row, ``id=1``, locked while it moves)."""

    last_event_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)
