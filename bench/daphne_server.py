"""The bench's servers: ``harness.servers.Server`` (the one launcher the tests and the harness use
too) with the bench's environment.

Started by the API scenarios themselves, so that a scenario can stop it and thereby close
every database connection the server holds before the counters are read.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/run.py and its children run with bench/ first on the path
    sys.path.insert(1, str(ROOT))

from harness.servers import (  # noqa: E402
    PROJECT_APP, Server, free_port, process_cpu_seconds, process_tree, server_env,
)

__all__ = ["Daphne", "free_port", "process_cpu_seconds", "process_tree"]


class Daphne(Server):
    """``daphne novelforge_sessions.asgi:application`` on a free loopback port.

    ``server="uvicorn"`` serves the same application with uvicorn instead (``workers`` > 1:
    that many processes behind the one port, uvicorn's own supervisor); ``app`` and
    ``settings`` serve another application (the floor: ``floorapp``; the stream's bare route:
    ``stream_asgi``).
    """

    def __init__(
        self, db_url: str, log_path: Path, extra_env: dict[str, str] | None = None, *, server: str = "daphne",
        app: str = PROJECT_APP, settings: str = "novelforge_sessions.settings", workers: int = 1,
    ) -> None:
        path = os.pathsep.join([str(ROOT / "bench"), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env = server_env(drop=("REDIS_URL", "DB_CONN_MAX_AGE"), DATABASE_URL=db_url, DJANGO_SETTINGS_MODULE=settings,
                         PYTHONPATH=path, LOG_LEVEL="WARNING", **(extra_env or {}))
        super().__init__(env, log_path, kind=server, app=app, workers=workers, ready_timeout=90.0)
