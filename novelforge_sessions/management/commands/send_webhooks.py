import logging
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from novelforge_sessions import tracing
from novelforge_sessions.control.long_waits import notice_long_waits
from novelforge_sessions.webhooks.sender import CONCURRENCY, Claim, Outcome, deliver, run_once

log = logging.getLogger("novelforge.webhooks")


def traced_attempt(item: Claim) -> Outcome:
    """One attempt in a ``webhook_attempt`` span (under the pass's): the delivery, its attempt and
    its outcome (the status; never the URL, the body, a secret or the signature)."""
    with tracing.span("webhook_attempt", delivery_id=item.delivery_id, webhook_id=item.webhook_id,
                      attempt=item.attempts) as span:
        outcome = deliver(item)
        span.set(outcome="delivered" if outcome.ok else "failed", status=outcome.status, latency_ms=outcome.latency_ms)
        return outcome


class Command(BaseCommand):
    help = "Deliver the projects' signed webhooks from the event log (docs/webhooks.md)."

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="keep sending every --interval seconds")
        parser.add_argument("--once", action="store_true", help="one pass: scan the log, make every due attempt (default)")
        parser.add_argument("--interval", type=float, default=1.0)
        parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="attempts in flight at once")

    def handle(self, *args, loop: bool, once: bool, interval: float, concurrency: int, **options):
        if loop and once:
            self.stderr.write("--loop and --once exclude each other")
            raise SystemExit(2)
        # httpx logs every request's URL at INFO; a webhook URL may carry a secret (a relay's path).
        logging.getLogger("httpx").setLevel(logging.WARNING)
        tracing.setup()  # OpenTelemetry, only when the OTEL_* environment asks for it
        while True:
            try:
                # A handoff waiting longer than the setting becomes an event first, so this pass sends it.
                with tracing.span("send_webhooks") as span:  # one trace per pass
                    notice_long_waits(settings.HANDOFF_LONG_WAIT_SECONDS)
                    counts = run_once(concurrency=concurrency, attempt=traced_attempt, hop=tracing.carry_context)
                    span.set(attempts=counts["attempts"], delivered=counts["delivered"], failed=counts["failed"])
            except Exception:
                if not loop:
                    raise
                log.exception("webhook pass failed; trying again in %s s", interval)
                counts = None
            if counts and counts["attempts"]:
                self.stdout.write(
                    f"{counts['attempts']} attempts: {counts['delivered']} delivered, {counts['failed']} failed"
                )
                self.stdout.flush()
            if not loop:
                return
            close_old_connections()
            time.sleep(interval)
