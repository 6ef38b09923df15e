import logging
import time

from django.core.management.base import BaseCommand
from django.db import DatabaseError, close_old_connections

from novelforge_sessions import tracing
from novelforge_sessions.actions.runtimes import reconcile_expired_runtimes
from novelforge_sessions.control import graph_gc
from novelforge_sessions.metrics import GRAPH_BLOBS_COLLECTED

log = logging.getLogger("novelforge.reconciler")


def graph_gc_pass(cursor: graph_gc.Cursor) -> graph_gc.PassResult | None:
    """One garbage collection pass of graph state (``control/graph_gc.py``), counted in the
    metrics; a database error is logged and the pass given up (the next pass starts again),
    never the loop's end: tidying leases is the reconciler's first job."""
    with tracing.span("graph_gc") as span:
        try:
            result = graph_gc.run_pass(cursor)
        except DatabaseError:
            log.exception("graph gc pass failed; the next pass tries again")
            return None
        GRAPH_BLOBS_COLLECTED.inc(len(result.collected.removed))
        span.set(blobs_removed=len(result.collected.removed), checkpoints_removed=result.retention.checkpoints)
    return result


class Command(BaseCommand):
    help = ("End runtimes whose lease expired (running sessions become failed/runtime_lost), then collect the "
            "graph state nothing cites (and thin old graph checkpoints with GRAPH_RETENTION_DAYS).")

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="keep reconciling every --interval seconds")
        parser.add_argument("--interval", type=float, default=5.0)
        parser.add_argument("--no-graph-gc", action="store_true", help="tidy leases only: no graph state collection")

    def handle(self, *args, loop: bool, interval: float, no_graph_gc: bool, **options):
        tracing.setup()  # OpenTelemetry, only when the OTEL_* environment asks for it
        cursor = graph_gc.Cursor()  # where the next pass's collection goes on
        while True:
            with tracing.span("reconcile") as span:  # one trace per pass, above its statements
                done = reconcile_expired_runtimes()
                span.set(runtimes_lost=len(done))
            for item in done:
                self.stdout.write(
                    f"runtime {item.runtime_id} of session {item.session_id} lost; session is {item.session_status}"
                )
            if not no_graph_gc:
                graph_gc_pass(cursor)
            if not loop:
                if not done:
                    self.stdout.write("no expired runtime leases")
                return
            close_old_connections()
            time.sleep(interval)
