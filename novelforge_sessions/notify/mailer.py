"""The mailer: turns waits in the event log into notices, and mails them in batches
(docs/notifications.md). A process of its own (``manage.py send_notifications --loop``), beside
the server and the webhook sender: the write path never waits for a mail.

One pass (``run_once``):

1. **Scan.** Under its cursor's row lock (``EmailCursor``), read the watched events after the
   cursor through ``events.events_after`` (the commit-ordered prefix of the log, as the webhook
   sender does: no event is skipped), make one ``EmailNotice`` per person the wait names
   (``recipients``), and move the cursor in the same transaction. A mailer that was down
   resumes from its cursor: nothing is lost.
2. **Claim.** People with waiting notices whose last mail is at least ``NOTIFY_BATCH_MINUTES``
   old and who are not leased, locked with ``SKIP LOCKED`` and leased to this mailer in one
   short transaction: two mailers never mail one person at once. A person who opted out (or
   has no address) gets none: their notices are dropped.
3. **Send** one mail per person, every waiting notice in it, with no transaction open.
4. **Record** the notices as sent and the person's ``last_mail_at`` while the lease is still
   this mailer's. A failed send releases the person for ``RETRY_SECONDS``; a mailer killed
   between send and record leaves a lease that runs out, and the mail is sent again (at least
   once, as the webhooks).
"""
from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.translation import gettext as _, ngettext

from novelforge_sessions import events
from novelforge_sessions.lifecycles import SessionStatus
from novelforge_sessions.models import Event, Membership
from novelforge_sessions.notify.models import EmailCursor, EmailNotice, EmailPreference
from reviews.models import ReviewAssignment, ReviewGate

log = logging.getLogger("novelforge.notify")

#: The event types that can name someone a wait is for.
WATCHED = ("review.gate_opened", "write_intent.created", "session.transitioned", "handoff.result_conflict")
SCAN_PAGE = 1000
#: People mailed per claim (one pass claims again until none is due).
CLAIM_BATCH = 20
#: How long a person is leased to one mailer while their mail is sent.
LEASE_SECONDS = 120
#: After a failed send (the SMTP server refused or was down), the person is tried again this much later.
RETRY_SECONDS = 60

Kind = EmailNotice.Kind


def _managers(project_id: int) -> list[int]:
    return list(Membership.objects.filter(project_id=project_id, role=Membership.Role.MANAGER)
                .values_list("user_id", flat=True))


def recipients(event: Event) -> list[tuple[int, str, str, int]]:
    """Whom an event's wait names: ``(user id, kind, page path, subject id)`` each. Nobody else."""
    p = event.payload or {}
    if event.type == "review.gate_opened":
        if p.get("route") not in ReviewGate.USER_ROUTES:
            return []  # an agent reviewer's gate waits on no person
        packet_id = p["packet_id"]
        users = (ReviewAssignment.objects.filter(packet_id=packet_id, reviewer_user__isnull=False)
                 .values_list("reviewer_user_id", flat=True))
        path = reverse("reviews:packet", args=[packet_id])
        return [(u, Kind.REVIEW, path, packet_id) for u in users]
    if event.type == "write_intent.created":
        if not p.get("requires_approval"):
            return []
        path = reverse("dashboard:project", args=[event.project_id]) + f"#intent-{p['intent_id']}"
        return [(u, Kind.APPROVAL, path, p["intent_id"]) for u in _managers(event.project_id)]
    if event.type == "session.transitioned":
        if p.get("to") != SessionStatus.FAILED or event.session_id is None:
            return []
        path = reverse("dashboard:session", args=[event.session_id])
        return [(u, Kind.SESSION_FAILED, path, event.session_id) for u in _managers(event.project_id)]
    if event.type == "handoff.result_conflict":
        if not p.get("open_conflict") or event.session_id is None:
            return []
        path = reverse("dashboard:session", args=[event.session_id])
        return [(u, Kind.CONFLICT, path, event.session_id) for u in _managers(event.project_id)]
    return []


# ---------------------------------------------------------------- 1. scan
def scan(page: int = SCAN_PAGE) -> int:
    """Turn the watched events after the cursor into notices (one page); returns the events read."""
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {EmailCursor._meta.db_table} (id, last_event_id, updated_at) "
                    "VALUES (1, 0, now()) ON CONFLICT (id) DO NOTHING")
    with transaction.atomic():
        cursor = EmailCursor.objects.select_for_update().get(id=1)
        marks = events.read_marks()
        read = events.events_after(Event.objects.filter(type__in=WATCHED), cursor.last_event_id, page, marks)
        notices = [
            EmailNotice(user_id=user_id, project_id=event.project_id, event_id=event.id, kind=kind, path=path,
                        subject_id=subject_id)
            for event in read for user_id, kind, path, subject_id in recipients(event)
        ]
        if notices:
            EmailPreference.objects.bulk_create(
                [EmailPreference(user_id=u) for u in sorted({n.user_id for n in notices})], ignore_conflicts=True)
            EmailNotice.objects.bulk_create(notices, ignore_conflicts=True)
        top = read[-1].id if len(read) >= page else max(events.latest_visible_id(marks), cursor.last_event_id)
        if top > cursor.last_event_id:
            cursor.last_event_id = top
            cursor.save(update_fields=["last_event_id", "updated_at"])
    return len(read)


# ---------------------------------------------------------------- 2. claim
@dataclass(frozen=True)
class Batch:
    preference_id: int
    lease_token: str
    user_id: int
    address: str
    name: str
    notices: tuple[EmailNotice, ...]


def _waiting(user_id) -> Any:
    return EmailNotice.objects.filter(user_id=user_id, sent_at__isnull=True, dropped_at__isnull=True)


def claim(limit: int = CLAIM_BATCH) -> tuple[list[Batch], int]:
    """Lease up to ``limit`` people whose batch is due to this mailer, with their waiting notices;
    and how many due people were passed over because they take no mail (their notices dropped)."""
    now = timezone.now()
    window = timedelta(minutes=settings.NOTIFY_BATCH_MINUTES)
    token = secrets.token_hex(8)
    batches = []
    dropped = 0
    with transaction.atomic():
        due = list(
            EmailPreference.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(Q(last_mail_at__isnull=True) | Q(last_mail_at__lte=now - window))
            .filter(Q(leased_until__isnull=True) | Q(leased_until__lte=now))
            .filter(Exists(_waiting(OuterRef("user_id"))))
            .select_related("user").order_by("last_mail_at", "id")[:limit]
        )
        for pref in due:
            user = pref.user
            if not (pref.email_enabled and user.is_active and user.email):
                _waiting(user.id).update(dropped_at=now)  # opted out (or no address): never mailed
                dropped += 1
                continue
            pref.leased_until = now + timedelta(seconds=LEASE_SECONDS)
            pref.lease_token = token
            pref.save(update_fields=["leased_until", "lease_token", "updated_at"])
            notices = tuple(_waiting(user.id).select_related("project").order_by("id"))
            batches.append(Batch(pref.id, token, user.id, user.email, user.get_full_name() or user.get_username(),
                                 notices))
    return batches, dropped


# ---------------------------------------------------------------- 3. send
def absolute(path: str) -> str:
    return settings.NOTIFY_BASE_URL.rstrip("/") + path


def notice_text(notice: EmailNotice) -> str:
    project = notice.project.name
    if notice.kind == Kind.REVIEW:
        return _("Review packet %(id)s in %(project)s is waiting for your verdict.") % {"id": notice.subject_id, "project": project}
    if notice.kind == Kind.APPROVAL:
        return _("Write intent %(id)s in %(project)s is waiting for an approval.") % {"id": notice.subject_id, "project": project}
    if notice.kind == Kind.SESSION_FAILED:
        return _("Session %(id)s in %(project)s failed.") % {"id": notice.subject_id, "project": project}
    return _("Session %(id)s in %(project)s has a conflicting result to resolve.") % {"id": notice.subject_id, "project": project}


def subject_of(notices: tuple[EmailNotice, ...]) -> str:
    if len(notices) == 1:
        kind = notices[0].kind
        return {
            Kind.REVIEW: _("NovelForge: a review is waiting for you"),
            Kind.APPROVAL: _("NovelForge: a write is waiting for your approval"),
            Kind.SESSION_FAILED: _("NovelForge: a session failed"),
            Kind.CONFLICT: _("NovelForge: a conflicting result needs a decision"),
        }[kind]
    return ngettext("NovelForge: %(count)d thing is waiting for you", "NovelForge: %(count)d things are waiting for you",
                    len(notices)) % {"count": len(notices)}


def message(batch: Batch) -> EmailMessage:
    """The batch's one mail: every notice with the absolute link to its page, and the opt-out page."""
    with translation.override(settings.LANGUAGE_CODE):
        items = [{"text": notice_text(n), "url": absolute(n.path)} for n in batch.notices]
        body = render_to_string("notify/email.txt", {
            "name": batch.name, "items": items, "settings_url": absolute(reverse("notifications")),
            "batch_minutes": settings.NOTIFY_BATCH_MINUTES,
        })
        subject = subject_of(batch.notices)
    return EmailMessage(subject=subject, body=body, from_email=settings.DEFAULT_FROM_EMAIL, to=[batch.address])


def send(batches: list[Batch]) -> dict[int, str]:
    """Send each batch's mail over one connection; the error of each one that failed, by preference id."""
    def error(exc: Exception) -> str:
        return f"{type(exc).__name__}: {exc}"[:300]

    mail = get_connection(fail_silently=False)
    try:
        mail.open()
    except Exception as exc:  # the SMTP server is down or refuses us: everyone is retried
        return {batch.preference_id: error(exc) for batch in batches}
    errors: dict[int, str] = {}
    try:
        for batch in batches:
            try:
                mail.send_messages([message(batch)])
            except Exception as exc:  # an SMTP refusal or a dropped connection: this person is retried
                errors[batch.preference_id] = error(exc)
    finally:
        try:
            mail.close()
        except Exception:  # closing a broken connection: the sends are already decided
            pass
    return errors


# ---------------------------------------------------------------- 4. record
def record(batch: Batch, error: str | None) -> bool:
    """The batch's notices sent and the person's window started (or, after ``error``, the person
    released for a retry), while the lease is still ours; False when it was not."""
    now = timezone.now()
    with transaction.atomic():
        ours = EmailPreference.objects.filter(id=batch.preference_id, lease_token=batch.lease_token)
        if error is not None:
            log.warning("mail to user %s failed (%s); trying again in %s s", batch.user_id, error, RETRY_SECONDS)
            return bool(ours.update(leased_until=now + timedelta(seconds=RETRY_SECONDS), lease_token="", updated_at=now))
        if not ours.update(last_mail_at=now, leased_until=None, lease_token="", updated_at=now):
            return False
        EmailNotice.objects.filter(id__in=[n.id for n in batch.notices], sent_at__isnull=True).update(sent_at=now)
    return True


def run_once() -> dict[str, int]:
    """Scan the whole visible log, then mail every person whose batch is due."""
    counts = {"events": 0, "mails": 0, "failed": 0}
    while True:
        read = scan()
        counts["events"] += read
        if read < SCAN_PAGE:
            break
    while True:
        batches, dropped = claim()
        if not batches:
            if dropped:
                continue
            break
        errors = send(batches)
        for batch in batches:
            error = errors.get(batch.preference_id)
            record(batch, error)
            counts["failed" if error else "mails"] += 1
    return counts


def preference_of(user) -> EmailPreference:
    """The person's preference row (made on first use)."""
    pref, _created = EmailPreference.objects.get_or_create(user=user)
    return pref


def set_email_enabled(user, enabled: bool) -> EmailPreference:
    with transaction.atomic():
        pref = EmailPreference.objects.select_for_update().get(id=preference_of(user).id)
        pref.email_enabled = enabled
        pref.save(update_fields=["email_enabled", "updated_at"])
    return pref

