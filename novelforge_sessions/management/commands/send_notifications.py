import logging
import time

from django.core.management.base import BaseCommand
from django.db import close_old_connections

from novelforge_sessions import tracing
from novelforge_sessions.notify.mailer import run_once

log = logging.getLogger("novelforge.notify")


class Command(BaseCommand):
    help = "Email the people a wait names, from the event log, in batches (docs/notifications.md)."

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="keep mailing every --interval seconds")
        parser.add_argument("--once", action="store_true", help="one pass: scan the log, send every due mail (default)")
        parser.add_argument("--interval", type=float, default=5.0)

    def handle(self, *args, loop: bool, once: bool, interval: float, **options):
        if loop and once:
            self.stderr.write("--loop and --once exclude each other")
            raise SystemExit(2)
        tracing.setup()  # OpenTelemetry, only when the OTEL_* environment asks for it
        while True:
            try:
                with tracing.span("send_notifications") as span:  # one trace per pass
                    counts = run_once()
                    span.set(mails=counts["mails"], failed=counts["failed"])
            except Exception:
                if not loop:
                    raise
                log.exception("notification pass failed; trying again in %s s", interval)
                counts = None
            if counts and (counts["mails"] or counts["failed"]):
                self.stdout.write(f"{counts['mails']} mails sent, {counts['failed']} failed")
                self.stdout.flush()
            if not loop:
                return
            close_old_connections()
            time.sleep(interval)
