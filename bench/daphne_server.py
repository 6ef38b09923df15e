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


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of another process so far, all its threads: ``/proc/<pid>/stat`` (Linux),
    in clock ticks (10 ms), which is exact enough over a measured window of seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daphne:
    """``daphne novelforge_sessions.asgi:application`` on a free loopback port.

    ``server="uvicorn"`` serves the same application with uvicorn instead (``workers`` > 1:
    that many processes behind the one port, uvicorn's own supervisor); ``app`` and
    ``settings`` serve another application (the floor: ``floorapp``).
    """

    def __init__(
        self, db_url: str, log_path: Path, extra_env: dict[str, str] | None = None, *, server: str = "daphne",
        app: str = "novelforge_sessions.asgi:application", settings: str = "novelforge_sessions.settings",
        workers: int = 1,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DB_CONN_MAX_AGE"}}
        env.update(
            DATABASE_URL=db_url, DJANGO_SETTINGS_MODULE=settings,
            PYTHONPATH=os.pathsep.join([str(ROOT / "bench"), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            ALLOWED_HOSTS="127.0.0.1,localhost", LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1",
        )
        env.update(extra_env or {})
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        if server == "daphne":
            cmd = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), app]
        elif workers == 1 and app == "novelforge_sessions.asgi:application":
            # the production server as make serve-cluster starts each of its processes
            cmd = [sys.executable, "-m", "novelforge_sessions.serve", "--host", "127.0.0.1", "--port", str(self.port)]
        else:  # several processes behind one port: uvicorn's own supervisor
            cmd = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(self.port), "--no-access-log",
                   "--log-level", "warning", "--lifespan", "off", "--workers", str(workers), app]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 90.0) -> None:
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

    def pids(self) -> list[int]:
        """The server process and its children (uvicorn's workers)."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, []))
        return out

    def cpu_seconds(self) -> float:
        total = 0.0
        for pid in self.pids():
            try:
                total += process_cpu_seconds(pid)
            except OSError:
                continue
        return total

    def rss_bytes(self) -> int:
        total = 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                continue
        return total

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
