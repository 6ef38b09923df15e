import logging
import time

from django.core.management.base import BaseCommand
from django.db import close_old_connections

from novelforge_sessions import tracing
from novelforge_sessions.actions.runtimes import reconcile_expired_runtimes

log = logging.getLogger("novelforge.reconciler")


class Command(BaseCommand):
    help = "End runtimes whose lease expired (running sessions become failed/runtime_lost)."

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="keep reconciling every --interval seconds")
        parser.add_argument("--interval", type=float, default=5.0)

    def handle(self, *args, loop: bool, interval: float, **options):
        tracing.setup()  # OpenTelemetry, only when the OTEL_* environment asks for it
        while True:
            with tracing.span("reconcile") as span:  # one trace per pass, above its statements
                done = reconcile_expired_runtimes()
                span.set(runtimes_lost=len(done))
            for item in done:
                self.stdout.write(
                    f"runtime {item.runtime_id} of session {item.session_id} lost; session is {item.session_status}"
                )
            if not loop:
                if not done:
                    self.stdout.write("no expired runtime leases")
                return
            close_old_connections()
            time.sleep(interval)
