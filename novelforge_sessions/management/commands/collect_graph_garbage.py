from django.core.management.base import BaseCommand

from novelforge_sessions import tracing
from novelforge_sessions.control import graph_gc
from novelforge_sessions.management.commands.reconcile_runtimes import graph_gc_pass


class Command(BaseCommand):
    help = ("One garbage collection pass of graph state on its own (what every reconciler pass does): "
            "retention (GRAPH_RETENTION_DAYS), then the blobs nothing cites, at most GRAPH_GC_MAX_PER_PASS.")

    def handle(self, *args, **options):
        tracing.setup()
        result = graph_gc_pass(graph_gc.Cursor())
        if result is None:
            raise SystemExit(1)
        self.stdout.write(result.line())
