"""A real server process for end-to-end tests (websockets and browsers).

pytest-django's ``live_server`` is WSGI only, so this starts ``daphne`` (as ``make run``
serves) or, with ``server="uvicorn"``, the production server ``python -m
novelforge_sessions.serve`` (as ``make serve-cluster`` serves) in a subprocess on a free port,
pointed at the *test* database (the subprocess does not inherit pytest-django's switch to it,
and would otherwise see none of the test's rows). Tests that use it must be
``django_db(transaction=True)`` so their rows are committed and visible to the server.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent.parent  # tests/live/__init__.py → repo root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url() -> str:
    db = settings.DATABASES["default"]
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


class DaphneServer:
    def __init__(self, *, redis_url: str | None = None, extra_env: dict[str, str] | None = None,
                 port: int | None = None, server: str = "daphne") -> None:
        self.server = server
        self.port = port or free_port()  # a given port: a restart on the same address
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL"}}
        env.update(
            DATABASE_URL=database_url(),
            DJANGO_SETTINGS_MODULE="novelforge_sessions.settings",
            ALLOWED_HOSTS="127.0.0.1,localhost",
            SECRET_KEY=settings.SECRET_KEY,
            PYTHONUNBUFFERED="1",
        )
        # Serve like `make run` does: connections come from psycopg's pool.
        env.setdefault("DB_POOL_MAX_SIZE", "8")
        if redis_url:
            env["REDIS_URL"] = redis_url
        env.update(extra_env or {})
        self.log_path = ROOT / "tests" / "artifacts" / f"{server}-{self.port}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        if server == "daphne":
            cmd = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                   "novelforge_sessions.asgi:application"]
        elif server == "uvicorn":
            cmd = [sys.executable, "-m", "novelforge_sessions.serve", "--host", "127.0.0.1", "--port", str(self.port)]
        else:
            raise ValueError(f"unknown server {server!r}")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.server} exited early; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.server} did not become ready; see {self.log_path}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()
