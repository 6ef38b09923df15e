"""A real daphne process serving the project (imitates tests/live.DaphneServer, without pytest).

Started by the API scenarios themselves, so that a scenario can stop it and thereby close
every database connection the server holds before the counters are read.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daphne:
    """``daphne novelforge_sessions.asgi:application`` on a free loopback port."""

    def __init__(self, db_url: str, log_path: Path, extra_env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DB_CONN_MAX_AGE"}}
        env.update(
            DATABASE_URL=db_url, DJANGO_SETTINGS_MODULE="novelforge_sessions.settings",
            ALLOWED_HOSTS="127.0.0.1,localhost", LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1",
        )
        env.update(extra_env or {})
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "novelforge_sessions.asgi:application"],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited early; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"daphne did not become ready; see {self.log_path}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if not self._log.closed:
            self._log.close()
