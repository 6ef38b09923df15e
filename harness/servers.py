"""The one way to start this project's server as a real process on a free loopback port.

The tests (``tests/support/servers.py``), the bench (``bench/daphne_server.py``) and the harness
(``harness/infra.py``) all start their servers through :class:`Server`; each of them only says
which environment the process gets. It lives in the harness package because all three can import
it: ``make harness`` runs ``python -m harness`` from the checkout, pytest runs from the checkout,
and the bench puts the checkout on ``sys.path`` itself. The product packages never import it, and
it imports nothing but the standard library (the bench runs in its own virtualenv).

``wait_until`` is the one polling helper the tests use too (``tests/support/waits.py``).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable, TypeVar

ROOT = Path(__file__).resolve().parent.parent

#: The project's ASGI application, as ``make run`` and ``make serve-cluster`` serve it.
PROJECT_APP = "novelforge_sessions.asgi:application"
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    predicate: Callable[[], T], what: str = "condition", *, timeout: float = 30.0, interval: float = 0.05,
    fail: Callable[[], str | None] | None = None, ignore: tuple[type[BaseException], ...] = (),
    error: type[Exception] = AssertionError,
) -> T:
    """Poll ``predicate`` every ``interval`` seconds until it returns a truthy value; return that value.

    Raises ``error`` once ``timeout`` seconds have passed (the predicate is tried once more at the
    deadline, so a slow machine never fails a condition that did come true). ``fail`` is asked before
    each try: a message from it stops the wait at once (a process that exited will never be ready).
    Exceptions of the ``ignore`` types count as "not yet" (a port that refuses connections).
    The interval is the only sleep: no test waits a fixed time for something to happen.
    """
    deadline = time.monotonic() + timeout
    while True:
        if fail is not None and (reason := fail()):
            raise error(f"{what}: {reason}")
        last_try = time.monotonic() >= deadline
        try:
            value = predicate()
        except ignore:
            value = None  # type: ignore[assignment]
        if value:
            return value
        if last_try:
            raise error(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(min(interval, max(deadline - time.monotonic(), 0.0)) or interval / 10)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of another process so far, all its threads: ``/proc/<pid>/stat`` (Linux),
    in clock ticks (10 ms), which is exact enough over a measured window of seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it (``/proc``, Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def server_env(base: dict[str, str] | None = None, *, drop: tuple[str, ...] = ("REDIS_URL",),
               **settings: str) -> dict[str, str]:
    """The environment every served process gets: ``base`` (default: this process's) without the
    ``drop`` names, loopback hosts allowed, unbuffered output, then ``settings``."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in drop}
    env.update(ALLOWED_HOSTS="127.0.0.1,localhost", PYTHONUNBUFFERED="1")
    env.update(settings)
    return env


def server_command(kind: str, port: int, app: str = PROJECT_APP, workers: int = 1) -> list[str]:
    """``daphne`` as ``make run`` serves; ``uvicorn``: the production server as ``make serve-cluster``
    starts each of its processes, or for another application or several workers uvicorn itself
    (its own supervisor, that many processes behind the one port)."""
    if kind == "daphne":
        return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), app]
    if kind != "uvicorn":
        raise ValueError(f"unknown server {kind!r}")
    if workers == 1 and app == PROJECT_APP:
        return [sys.executable, "-m", "novelforge_sessions.serve", "--host", "127.0.0.1", "--port", str(port)]
    return [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
            "--log-level", "warning", "--lifespan", "off", "--workers", str(workers), app]


class Server:
    """One server process on a fixed loopback port, ready once ``/healthz`` answers 200.

    ``start=False`` only picks the port (``start()`` later, and again after the process died:
    the same port). ``log_path`` may be a function of the port. The log is appended to, unless
    ``fresh_log`` (the first start truncates it). A start that does not become ready stops the
    process before raising.
    """

    def __init__(
        self, env: dict[str, str], log_path: Path | Callable[[int], Path], *, kind: str = "daphne",
        app: str = PROJECT_APP, workers: int = 1, port: int | None = None, start: bool = True,
        fresh_log: bool = False, ready_timeout: float = 60.0, stop_timeout: float = 10.0,
    ) -> None:
        self.kind = kind
        self.app = app
        self.workers = workers
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.env = env
        self.log_path = Path(log_path(self.port) if callable(log_path) else log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._fresh_log = fresh_log
        if start:
            self.start()

    def start(self, extra_env: dict[str, str] | None = None, timeout: float | None = None) -> float:
        """Start the process and wait for ``/healthz``; returns the seconds it took."""
        t0 = time.monotonic()
        mode = "wb" if self._fresh_log and not self.starts else "ab"
        with open(self.log_path, mode) as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                server_command(self.kind, self.port, self.app, self.workers), cwd=ROOT,
                env={**self.env, **(extra_env or {})}, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        self.starts += 1
        proc = self.proc
        try:
            wait_until(self._healthy, f"{self.kind} on {self.url} (log: {self.log_path})",
                       timeout=timeout or self.ready_timeout, interval=0.05, ignore=(OSError,), error=RuntimeError,
                       fail=lambda: None if proc.poll() is None else f"exited with {proc.returncode} during start-up")
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def _healthy(self) -> bool:
        with urllib.request.urlopen(self.url + "/healthz", timeout=1) as resp:
            return resp.status == 200

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pids(self) -> list[int]:
        """The server process and its children (uvicorn's workers)."""
        return process_tree(self.proc.pid) if self.proc else []

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

    def rss_kb(self) -> int:
        return self.rss_bytes() // 1024

    def stop(self) -> None:
        """SIGTERM (the server drains), then SIGKILL after ``stop_timeout`` seconds."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

