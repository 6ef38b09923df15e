"""Throwaway infrastructure on loopback: a PostgreSQL cluster, a redis-server and daphne
processes, each on a free port in a temporary folder, all stopped by ``Infra.close()``.

The machine's own PostgreSQL (5432) and Redis (6379) are never touched: the harness restarts
and kills only what it started here.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness.servers import ROOT, Server, free_port, server_env


def _pg_bin() -> Path:
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / "initdb").exists():
            return d
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise RuntimeError("the harness needs PostgreSQL's server binaries (initdb, pg_ctl)")


def _as_owner(cmd: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root (so that a compromised server cannot own the
    # machine): run them as the postgres user then.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class Postgres:
    """A throwaway cluster: initdb in a temporary folder, trust auth, loopback, a free port."""

    def __init__(self, base: Path) -> None:
        self.bin = _pg_bin()
        self.dir = base / "pg"
        self.dir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(base, "postgres")
            shutil.chown(self.dir, "postgres")
        self.data = self.dir / "data"
        self.port = free_port()
        self.log = self.dir / "postgres.log"
        subprocess.run(_as_owner([str(self.bin / "initdb"), "-D", str(self.data), "--auth=trust", "-U", "postgres",
                                  "--encoding=UTF8", "--no-sync"]),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
        self.start()

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            _as_owner([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", *args]),
            check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/",
        )

    def start(self) -> None:
        self._ctl("-o", f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c max_connections=60 "
                        "-c fsync=on", "start")

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut, the server is back ~1 s later."""
        self._ctl("-m", "fast", "-o", f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} "
                                      "-c max_connections=60", "restart")

    def stop(self) -> None:
        try:
            self._ctl("-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass

    def url(self, db: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"


class Redis:
    def __init__(self, base: Path) -> None:
        self.port = free_port()
        self.dir = base / "redis"
        self.dir.mkdir()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if not exe:
            raise RuntimeError("the harness needs redis-server")
        self.proc = subprocess.Popen(
            [exe, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(self.dir)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


#: A harness server: one process on a fixed port; ``start()`` again after it died (same port).
Daphne = Server


class Infra:
    def __init__(self, *, redis: bool = False) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="nf-harness-"))
        self.pg = Postgres(self.base)
        self.redis = Redis(self.base) if redis else None
        self.servers: list[Daphne] = []

    def server_env(self, database_url: str, **extra: str) -> dict[str, str]:
        return server_env(
            drop=("REDIS_URL", "NOVELFORGE_FAULT_POINTS", "DATABASE_URL", "SECRET_KEY", "REQUIRE_SECRET_KEY"),
            DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="novelforge_sessions.settings", DB_POOL_MAX_SIZE="8",
            PYTHONPATH=str(ROOT), LOG_LEVEL="WARNING", SHUTDOWN_GRACE_SECONDS="2", **extra,
        )

    def daphne(self, env: dict[str, str], name: str) -> Daphne:
        """A daphne on its own port, not started yet (``start()``; SIGTERM and 15 s to drain on stop)."""
        d = Server(env, self.base / f"daphne-{name}.log", start=False, stop_timeout=15)
        self.servers.append(d)
        return d

    def close(self, keep: bool = False) -> None:
        for d in self.servers:
            try:
                d.stop()
            except Exception:  # noqa: BLE001 — best effort: stop the rest
                pass
        if self.redis:
            self.redis.stop()
        self.pg.stop()
        if not keep:
            shutil.rmtree(self.base, ignore_errors=True)
