"""One benchmark scenario per process: ``python bench/workloads.py --scenario NAME ...``.

Run by ``bench/run.py`` inside ``bench/.venv``; each scenario gets a fresh interpreter so that
one system's threads, pools and caches never leak into another's numbers. The scenario prints
one line ``RESULT {json}`` on stdout.

What one "durable step" is, per system (bench/README.md explains why these are the fair pairs):

- floor: one single-row INSERT committed alone with raw psycopg (what a durable commit costs here);
- ours, action layer: ``record_checkpoint`` for an open run (one checkpoint row, one event);
- ours, HTTP API: ``POST /api/v1/runs/{id}/checkpoints`` against a real daphne process, with the
  without a connection pool (``ours_api``) and with the pool `make run` uses (``ours_api_tuned``);
- DBOS: one ``@DBOS.step()`` call inside an already running ``@DBOS.workflow()`` (headline), and,
  for reference, one whole workflow that runs one step;
- LangGraph: one superstep of a compiled graph checkpointed by ``PostgresSaver``, with
  ``durability="sync"`` (headline) and, for reference, LangGraph's default ``"async"``.

Every scenario: set up and warm up outside the measured window, let the database go quiet,
read the counters, run ``--workers`` threads that together do ``--steps`` steps (split evenly,
each thread on its own run/workflow/thread id), close every connection, let the database go
quiet again, read the counters. Systems that keep connections open while running (DBOS, the
pooled API) wait out PostgreSQL's idle statistics flush instead; see ``PG_IDLE_STATS_FLUSH_S``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

from daphne_server import process_cpu_seconds  # noqa: E402
from pgstats import Counters, Snapshot  # noqa: E402

WARMUP_STEPS = 20

# PostgreSQL 15+ flushes an idle backend's pending statistics after 10 s (PGSTAT_IDLE_INTERVAL).
# DBOS (and our API with persistent connections) keep their connections open, so the only way to
# have the warm-up's counts land *before* the measured window is to leave them idle that long;
# this waits for a server timer that cannot be polled, it is not a synchronisation sleep.
PG_IDLE_STATS_FLUSH_S = 10.5
DBOS_IDLE_PROBE_S = 3.0

Body = Callable[[], list[float]]  # runs one worker's measured steps, returns per-step seconds


def timed_body(count: int, deadline: float, hit: threading.Event, step: Callable[[int], None],
               close: Callable[[], None] | None = None) -> Body:
    """One worker's measured loop: ``step(i)`` for i < ``count`` until ``deadline`` (``hit`` is
    set if it cut the loop short), timing each step; ``close`` runs after the loop, whatever
    happened."""

    def body() -> list[float]:
        latencies = []
        try:
            for i in range(count):
                if time.perf_counter() > deadline:
                    hit.set()
                    break
                t0 = time.perf_counter()
                step(i)
                latencies.append(time.perf_counter() - t0)
        finally:
            if close is not None:
                close()
        return latencies

    return body


def keepalive_body(api: Any, count: int, deadline: float, hit: threading.Event,
                   step: Callable[[Any, int], None]) -> Body:
    """One HTTP worker on its own keep-alive connection to ``api`` (a parsed URL), opened now:
    ``timed_body`` of ``step(conn, i)``."""
    import http.client

    conn = http.client.HTTPConnection(api.hostname, api.port, timeout=30)
    conn.connect()
    return timed_body(count, deadline, hit, lambda i: step(conn, i), conn.close)


# ---------------------------------------------------------------- shared machinery
def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile of ``values`` (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def run_workers(workers: int, prepare: Callable[[int], Body]) -> tuple[list[list[float]], float, float]:
    """Start ``workers`` threads; each calls ``prepare(index)`` (unmeasured), then all start the
    returned bodies together. Returns each worker's latencies, the wall time of the bodies and
    the CPU time this process (all its threads) spent meanwhile."""
    barrier = threading.Barrier(workers + 1)
    results: list[list[float]] = [[] for _ in range(workers)]
    errors: list[BaseException] = []

    def thread_main(index: int) -> None:
        try:
            body = prepare(index)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
            return
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        try:
            results[index] = body()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread_main, args=(i,), name=f"bench-worker-{i}") for i in range(workers)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    started, cpu_started = time.perf_counter(), time.process_time()
    for t in threads:
        t.join()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    if errors:
        raise errors[0]
    return results, elapsed, cpu


def summarize(
    *, system: str, scenario: str, workers: int, latencies: list[list[float]], elapsed: float, cpu_s: float,
    before: Snapshot, after: Snapshot, counters: Counters, quiesced: bool, deadline_hit: bool,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    flat = [x for worker in latencies for x in worker]
    steps = len(flat)
    if not steps:
        raise RuntimeError("no step completed inside the time bound")

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000, 3)

    xacts = after.xacts - before.xacts
    rows = after.rows_written - before.rows_written
    writers = counters.writer_xids_since(before)
    result: dict[str, Any] = {
        "system": system,
        "scenario": scenario,
        "workers": workers,
        "steps": steps,
        "elapsed_s": round(elapsed, 4),
        "steps_per_s": round(steps / elapsed, 2) if elapsed > 0 else None,
        "cpu_ms_per_step": round(cpu_s / steps * 1000, 3),
        "latency_ms": {
            "p50": ms(percentile(flat, 50)),
            "p95": ms(percentile(flat, 95)),
            "p99": ms(percentile(flat, 99)),
            "mean": ms(sum(flat) / steps),
            "max": ms(max(flat)),
        },
        "xacts": xacts,
        "xacts_per_step": round(xacts / steps, 3),
        "rows_written": rows,
        "rows_written_per_step": round(rows / steps, 3),
        "writer_xids": writers,
        "write_xacts_per_step": round(writers / steps, 3) if writers >= 0 else None,
        "quiesced": quiesced,
        "deadline_hit": deadline_hit,
        "latencies_ms": [[round(x * 1000, 3) for x in worker] for worker in latencies],
    }
    result.update(extra or {})
    return result


def split(steps: int, workers: int) -> list[int]:
    base, rest = divmod(steps, workers)
    return [base + (1 if i < rest else 0) for i in range(workers)]


# ---------------------------------------------------------------- floor
def run_floor(args: argparse.Namespace, counters: Counters) -> dict[str, Any]:
    """The machine's floor: one single-row INSERT committed on its own, with raw psycopg.

    Not a durable-execution system; it shows what one durable commit (WAL flush) costs here,
    so the other rows can be read as "commits times this, plus framework".
    """
    import psycopg

    table = "bench_floor_step"
    with psycopg.connect(args.db_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, worker int NOT NULL, cursor jsonb NOT NULL)")
        for i in range(WARMUP_STEPS):
            conn.execute(f"INSERT INTO {table} (worker, cursor) VALUES (%s, %s)", (-1, json.dumps({"step": i})))
    quiesced = counters.quiesce()
    before = counters.settled_snapshot()
    deadline = time.perf_counter() + args.max_seconds
    hit = threading.Event()

    def prepare(index: int) -> Body:
        conn = psycopg.connect(args.db_url, autocommit=True)

        def step(i: int) -> None:
            conn.execute(f"INSERT INTO {table} (worker, cursor) VALUES (%s, %s)", (index, json.dumps({"step": i})))

        return timed_body(split(args.steps, args.workers)[index], deadline, hit, step, conn.close)

    latencies, elapsed, cpu_s = run_workers(args.workers, prepare)
    quiesced = counters.quiesce() and quiesced
    after = counters.settled_snapshot()
    result = summarize(
        system="floor", scenario="insert_commit", workers=args.workers, latencies=latencies, elapsed=elapsed, cpu_s=cpu_s,
        before=before, after=after, counters=counters, quiesced=quiesced, deadline_hit=hit.is_set(),
    )
    with psycopg.connect(args.db_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {table}")
    return result


# ---------------------------------------------------------------- ours
def setup_django(db_url: str) -> None:
    os.environ["DATABASE_URL"] = db_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "novelforge_sessions.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def ours_fixture(label: str, runs: int) -> tuple[Any, str, list[int]]:
    """A fresh project, an all-permission token, and ``runs`` sessions each with an open run."""
    from novelforge_sessions.actions.runs import start_run
    from novelforge_sessions.actions.runtimes import RuntimeSpec
    from novelforge_sessions.actions.sessions import NewSession, create_session
    from novelforge_sessions.actions.tokens import ALL_PERMISSIONS, create_token
    from novelforge_sessions.apikit.auth import caller_for_token
    from novelforge_sessions.models import Project

    project = Project.objects.create(
        slug=f"bench-{label}-{uuid.uuid4().hex[:8]}", name=f"Bench {label}", lock_fingerprint="sha256:" + "a" * 64,
    )
    _, raw = create_token(project, name="bench", permissions=ALL_PERMISSIONS)
    caller = caller_for_token(raw)  # the same Caller an API request would get
    assert caller is not None
    spec = NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="claude-code")
    runtime = RuntimeSpec(runtime_family="claude-code", capabilities=["draft"], lease_seconds=3600)
    run_ids = []
    for _ in range(runs):
        session = create_session(caller, spec, runtime=runtime)
        run_ids.append(start_run(caller, session.id, cursor={"step": "start"}).id)
    return caller, raw, run_ids


def checkpoint_body(worker: int, step: int) -> dict[str, Any]:
    return {"boundary": "context_freeze", "cursor": {"step": step, "worker": worker}}


def run_ours_action(args: argparse.Namespace, counters: Counters) -> dict[str, Any]:
    setup_django(args.db_url)
    from django.db import connection

    from novelforge_sessions.control.checkpoints import record_checkpoint

    caller, _, run_ids = ours_fixture("action", args.workers + 1)
    warm_run = run_ids.pop()
    for i in range(WARMUP_STEPS):
        record_checkpoint(caller, warm_run, checkpoint_body(-1, i))
    connection.close()
    quiesced = counters.quiesce()
    before = counters.settled_snapshot()
    deadline = time.perf_counter() + args.max_seconds
    hit = threading.Event()

    def prepare(index: int) -> Body:
        connection.ensure_connection()  # Django connections are per thread; open it outside the timing
        return timed_body(split(args.steps, args.workers)[index], deadline, hit,
                          lambda i: record_checkpoint(caller, run_ids[index], checkpoint_body(index, i)), connection.close)

    latencies, elapsed, cpu_s = run_workers(args.workers, prepare)
    quiesced = counters.quiesce() and quiesced
    after = counters.settled_snapshot()
    return summarize(
        system="ours", scenario="action", workers=args.workers, latencies=latencies, elapsed=elapsed, cpu_s=cpu_s,
        before=before, after=after, counters=counters, quiesced=quiesced, deadline_hit=hit.is_set(),
    )


def run_ours_api(args: argparse.Namespace, counters: Counters) -> dict[str, Any]:
    """Checkpoints through the real HTTP API, against a daphne process this scenario starts.

    ``ours_api`` runs the server without a connection pool (``DB_POOL_MAX_SIZE=0``: a new
    connection per request); ``ours_api_tuned`` runs it as ``make run`` does, with psycopg's
    pool (``DB_POOL_MAX_SIZE=8``). Both start connections in UTC (settings ``options``).
    """
    import http.client
    from urllib.parse import urlsplit

    from daphne_server import Daphne

    tuned = args.scenario == "ours_api_tuned"
    setup_django(args.db_url)
    from django.db import connection

    _, raw, run_ids = ours_fixture("api", args.workers + 1)
    connection.close()
    headers = {"Authorization": f"Bearer {raw}", "Content-Type": "application/json"}

    def post(conn: http.client.HTTPConnection, run_id: int, body: dict[str, Any]) -> None:
        conn.request("POST", f"/api/v1/runs/{run_id}/checkpoints", body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
        if resp.status != 201:
            raise RuntimeError(f"checkpoint POST answered {resp.status}: {payload[:300]!r}")

    extra_env = {"DB_POOL_MAX_SIZE": "8" if tuned else "0"}
    server = Daphne(args.db_url, Path(args.log_file), extra_env=extra_env)
    try:
        api = urlsplit(server.url)
        warm = http.client.HTTPConnection(api.hostname, api.port, timeout=30)
        warm_run = run_ids.pop()
        for i in range(WARMUP_STEPS):
            post(warm, warm_run, checkpoint_body(-1, i))
        warm.close()
        if tuned:
            # The pool keeps its connections open: wait for PostgreSQL's idle stats flush.
            time.sleep(PG_IDLE_STATS_FLUSH_S)
            quiesced = True
            before = counters.snapshot()
        else:
            quiesced = counters.quiesce()
            before = counters.settled_snapshot()
        deadline = time.perf_counter() + args.max_seconds
        hit = threading.Event()

        def prepare(index: int) -> Body:
            return keepalive_body(api, split(args.steps, args.workers)[index], deadline, hit,
                                  lambda conn, i: post(conn, run_ids[index], checkpoint_body(index, i)))

        server_cpu_started = process_cpu_seconds(server.proc.pid)
        latencies, elapsed, client_cpu_s = run_workers(args.workers, prepare)
        cpu_s = process_cpu_seconds(server.proc.pid) - server_cpu_started  # the system here is daphne
    finally:
        server.stop()  # closes whatever connections the server still holds
    quiesced = counters.quiesce() and quiesced
    after = counters.settled_snapshot()
    return summarize(
        system="ours", scenario="api_tuned" if tuned else "api", workers=args.workers, latencies=latencies,
        elapsed=elapsed, cpu_s=cpu_s, before=before, after=after, counters=counters, quiesced=quiesced, deadline_hit=hit.is_set(),
        extra={
            "server_settings": "DB_POOL_MAX_SIZE=8 (as make run)" if tuned else "DB_POOL_MAX_SIZE=0 (no pool)",
            "client_cpu_ms_per_step": round(client_cpu_s / max(1, sum(map(len, latencies))) * 1000, 3),
        },
    )


# ---------------------------------------------------------------- the goals: HTTP
BATCH_SIZE = 10


def _subscribers(url: str, token: str, project_id: int, count: int) -> subprocess.Popen:
    """``count`` websocket subscribers on the project, in a process of their own (P5).

    Real peers run elsewhere: in the writers' process their frames would compete with the
    8 writer threads for one GIL (the sync client also runs a thread per connection), and the
    writers' rate would measure the bench's client rather than the server. The child holds
    every socket on one asyncio loop, prints ``READY`` once each has caught up, and counts
    events until it has the number its parent then writes to its stdin (or 10 s pass without
    one more); then it prints ``EVENTS <n> FRAMES <m>`` (the events, and the frames they came
    in). They subscribe with ``batch`` as the dashboard and ``novelforge_client`` do: each frame
    carries the events one delivery found.
    """
    proc = subprocess.Popen(
        [sys.executable, __file__, "--_subscribe", url, token, str(project_id), str(count)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    line = proc.stdout.readline().strip()
    if line != "READY":
        proc.kill()
        raise RuntimeError(f"subscribers failed: {line or proc.stdout.read()[-500:]!r}")
    return proc


def _subscribers_stop(proc: subprocess.Popen, expected: int) -> tuple[int, int]:
    """Tell the subscribers how many events to expect in all; the events and the frames they received.

    They stop once every frame has arrived, or after 10 s without one more.
    """
    try:
        out, _ = proc.communicate(input=f"{expected}\n", timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise RuntimeError("subscribers did not stop") from None
    counts = [ln for ln in out.splitlines() if ln.startswith("EVENTS ")]
    if not counts:
        raise RuntimeError(f"subscribers ended without a count: {out[-500:]!r}")
    fields = counts[-1].split()
    return int(fields[1]), int(fields[3])


def _subscribe_main(url: str, token: str, project_id: int, count: int) -> int:
    """The subscribers' process (``--_subscribe``): see ``_subscribers``."""
    import asyncio

    from websockets.asyncio.client import connect

    async def main() -> int:
        ws_url = url.replace("http://", "ws://") + "/ws/events/"
        sockets = []
        for _ in range(count):
            ws = await connect(ws_url, origin=url, additional_headers={"Authorization": f"Bearer {token}"},
                               open_timeout=30, max_size=None)
            # As the dashboard and novelforge_client subscribe: several events to a frame.
            await ws.send(json.dumps({"type": "subscribe", "project_id": project_id, "batch": True}))
            while json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] != "caught_up":
                pass
            sockets.append(ws)
        print("READY", flush=True)
        events, frames, progress = 0, 0, asyncio.Event()

        async def read(ws: Any) -> None:
            nonlocal events, frames
            async for text in ws:
                frame = json.loads(text)
                if frame.get("type") == "events":
                    events += len(frame["events"])
                    frames += 1
                    progress.set()

        readers = [asyncio.ensure_future(read(ws)) for ws in sockets]
        expected = int(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
        while events < expected:
            progress.clear()
            try:
                await asyncio.wait_for(progress.wait(), 10)
            except TimeoutError:
                break
        for task in readers:
            task.cancel()
        for ws in sockets:
            await ws.close()
        return events, frames

    events, frames = asyncio.run(main())
    print(f"EVENTS {events} FRAMES {frames}", flush=True)
    return 0


def _manager_cookie(project_id: int) -> str:
    """A session cookie of a manager of the project, as a browser holds one after logging in
    (what Django's test client's ``force_login`` stores), for the page readers of a soak."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model

    from novelforge_sessions.models import Membership

    user = get_user_model().objects.create_user(f"bench-manager-{uuid.uuid4().hex[:8]}", password=uuid.uuid4().hex)
    Membership.objects.create(user=user, project_id=project_id, role=Membership.Role.MANAGER)
    store = import_module(settings.SESSION_ENGINE).SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    return f"{settings.SESSION_COOKIE_NAME}={store.session_key}"


class PageReader(threading.Thread):
    """A manager with pages open: every ``interval`` seconds until ``deadline``, loads the
    dashboard, the page of a session being written to and the project's newest events
    (``GET /api/v1/events``), over one keep-alive connection, as a browser tab refreshing
    would. Counts the pages, the ones not answered 200, and their latencies."""

    def __init__(self, url: str, cookie: str, token: str, session_id: int, interval: float, deadline: float) -> None:
        super().__init__(daemon=True)
        self.url, self.interval, self.deadline = url, interval, deadline
        self.requests = [("/", {"Cookie": cookie}), (f"/sessions/{session_id}/", {"Cookie": cookie}),
                         ("/api/v1/events?limit=50", {"Authorization": f"Bearer {token}"})]
        self.latencies: list[float] = []
        self.errors: list[str] = []

    def run(self) -> None:
        import http.client
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        try:
            while time.perf_counter() < self.deadline:
                started = time.perf_counter()
                for path, headers in self.requests:
                    t0 = time.perf_counter()
                    try:
                        conn.request("GET", path, headers=headers)
                        resp = conn.getresponse()
                        resp.read()
                        if resp.status != 200:
                            self.errors.append(f"{path}: {resp.status}")
                    except (OSError, http.client.HTTPException) as exc:
                        self.errors.append(f"{path}: {type(exc).__name__}")
                        conn.close()
                    self.latencies.append(time.perf_counter() - t0)
                time.sleep(max(0.0, self.interval - (time.perf_counter() - started)))
        finally:
            conn.close()


def run_http(args: argparse.Namespace, counters: Counters) -> dict[str, Any]:
    """One HTTP goal row: ``--kind`` floor | single | batch against a real server process.

    Keep-alive loopback clients (``--workers`` threads, one connection each); the measured
    window is ``--steps`` requests (split across the clients) or ``--max-seconds``, whichever
    ends first. CPU is the server's (every process of it), read from /proc around the window;
    RSS is sampled after the warm-up and at the end (``rss_drift``).
    """
    import http.client
    from urllib.parse import urlsplit

    from daphne_server import Daphne

    setup_django(args.db_url)
    from django.db import connection

    kind, subscribers = args.kind, args.subscribers
    env = {"DB_POOL_MAX_SIZE": "10", "API_LEAN": "true" if args.lean else "false",
           "LIVE_SWEEP_SECONDS": "60"}
    if args.redis_url:
        env["REDIS_URL"] = args.redis_url
    if kind == "floor":
        with connection.cursor() as cur:
            cur.execute("DROP TABLE IF EXISTS bench_floor_api")
            cur.execute("CREATE TABLE bench_floor_api (id bigserial PRIMARY KEY, cursor jsonb NOT NULL)")
        raw, run_ids, project_id = "", [0] * (args.workers + 1), None
        server_kw = {"app": "floorapp.asgi:application", "settings": "floorapp.settings"}
    else:
        caller, raw, run_ids = ours_fixture(kind, args.workers + 1)
        project_id = next(iter(caller.project_ids))
        server_kw = {}
    if args.pages:
        from novelforge_sessions.models import Run

        cookie, watched_session = _manager_cookie(project_id), Run.objects.get(id=run_ids[0]).session_id
    connection.close()
    headers = {"Content-Type": "application/json"}
    if raw:
        headers["Authorization"] = f"Bearer {raw}"

    def request_for(worker: int, step: int) -> tuple[str, str, int]:
        if kind == "floor":
            return "/floor", json.dumps({"cursor": {"step": step, "worker": worker}}), 1
        if kind == "single":
            return f"/api/v1/runs/{run_ids[worker]}/checkpoints", json.dumps(checkpoint_body(worker, step)), 1
        items = [{"kind": "checkpoint", "checkpoint": checkpoint_body(worker, step * BATCH_SIZE + i)} for i in range(BATCH_SIZE)]
        return f"/api/v1/runs/{run_ids[worker]}/batch", json.dumps({"items": items}), BATCH_SIZE

    def post(conn: http.client.HTTPConnection, worker: int, step: int) -> int:
        path, body, n = request_for(worker, step)
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
        if resp.status != 201:
            raise RuntimeError(f"{path} answered {resp.status}: {payload[:300]!r}")
        return n

    server = Daphne(args.db_url, Path(args.log_file), extra_env=env, server=args.server, workers=args.server_workers,
                    **server_kw)
    subs: subprocess.Popen | None = None
    events_received = frames_received = 0
    steps_done = [0] * args.workers
    try:
        api = urlsplit(server.url)
        warm = http.client.HTTPConnection(api.hostname, api.port, timeout=30)
        for i in range(WARMUP_STEPS * 3):
            post(warm, args.workers, i)
        warm.close()
        if subscribers:
            subs = _subscribers(server.url, raw, project_id, subscribers)
        deadline = time.perf_counter() + args.max_seconds
        hit = threading.Event()

        def prepare(index: int) -> Body:
            def step(conn: Any, i: int) -> None:
                steps_done[index] += post(conn, index, i)

            return keepalive_body(api, split(args.steps, args.workers)[index], deadline, hit, step)

        reader = None
        if args.pages:
            reader = PageReader(server.url, cookie, raw, watched_session, args.pages, deadline)
            reader.start()
        rss_start = server.rss_bytes()
        rss_marks: dict[str, int] = {}
        if args.rss_after:  # sustained runs: the start sample after the caches have filled
            timer = threading.Timer(args.max_seconds * args.rss_after, lambda: rss_marks.setdefault("start", server.rss_bytes()))
            timer.daemon = True
            timer.start()
        cpu_started = server.cpu_seconds()
        latencies, elapsed, client_cpu_s = run_workers(args.workers, prepare)
        cpu_s = server.cpu_seconds() - cpu_started
        if reader is not None:
            reader.join(timeout=60)
        rss_end = server.rss_bytes()
        rss_start = rss_marks.get("start", rss_start)
    finally:
        try:
            if subs is not None:
                events_received, frames_received = _subscribers_stop(subs, sum(steps_done) * subscribers)
        finally:
            server.stop()
    flat = [x for w in latencies for x in w]
    requests = len(flat)
    if not requests:
        raise RuntimeError("no request completed inside the time bound")
    steps = sum(steps_done)
    return {
        "system": "ours" if kind != "floor" else "floor", "scenario": f"http_{kind}", "kind": kind,
        "server": args.server, "server_workers": args.server_workers, "lean": bool(args.lean),
        "subscribers": subscribers, "workers": args.workers, "requests": requests, "steps": steps,
        "elapsed_s": round(elapsed, 3), "requests_per_s": round(requests / elapsed, 1),
        "steps_per_s": round(steps / elapsed, 1),
        "cpu_ms_per_request": round(cpu_s / requests * 1000, 3), "cpu_ms_per_step": round(cpu_s / steps * 1000, 3),
        "client_cpu_ms_per_request": round(client_cpu_s / requests * 1000, 3),
        "latency_ms": {"p50": round(percentile(flat, 50) * 1000, 3), "p99": round(percentile(flat, 99) * 1000, 3)},
        "rss_start_bytes": rss_start, "rss_end_bytes": rss_end,
        "rss_drift": round((rss_end - rss_start) / rss_start, 4) if rss_start else None,
        "events_received": events_received, "frames_received": frames_received, "events_expected": steps * subscribers, "deadline_hit": hit.is_set(),
        **({"pages": len(reader.latencies), "page_errors": reader.errors[:20], "page_error_count": len(reader.errors),
            "page_p99_ms": round(percentile(reader.latencies, 99) * 1000, 1) if reader.latencies else None}
           if reader is not None else {}),
    }


# ---------------------------------------------------------------- DBOS
def run_dbos(args: argparse.Namespace, counters: Counters) -> dict[str, Any]:
    from dbos import DBOS, DBOSConfig

    shape = args.scenario  # dbos_step_in_workflow | dbos_workflow_per_step
    config: DBOSConfig = {"name": "nfbench", "system_database_url": args.db_url, "log_level": "WARNING"}
    DBOS(config=config)
    step_latencies: dict[int, list[float]] = {}

    @DBOS.step()
    def durable_step(worker: int, step: int) -> dict[str, int]:
        return {"step": step, "worker": worker}

    @DBOS.workflow()
    def many_steps(worker: int, count: int, deadline: float) -> int:
        # One workflow = one of our runs; each step = one of our checkpoints. Latencies go to a
        # dict on the side so the workflow's recorded output stays as small as ours.
        latencies = step_latencies.setdefault(worker, [])
        done = 0
        for i in range(count):
            if time.perf_counter() > deadline:
                break
            t0 = time.perf_counter()
            durable_step(worker, i)
            latencies.append(time.perf_counter() - t0)
            done += 1
        return done

    @DBOS.workflow()
    def one_step(worker: int, step: int) -> dict[str, int]:
        return durable_step(worker, step)

    DBOS.launch()
    try:
        many_steps(-1, WARMUP_STEPS, time.perf_counter() + 60)
        for i in range(5):
            one_step(-1, i)
        step_latencies.clear()
        if not args.fast:  # the goals table needs no transaction counts: skip the idle windows
            time.sleep(PG_IDLE_STATS_FLUSH_S)
        idle_start = counters.snapshot()
        time.sleep(DBOS_IDLE_PROBE_S if not args.fast else 0.2)
        before = counters.snapshot()
        deadline = time.perf_counter() + args.max_seconds
        hit = threading.Event()

        def prepare(index: int) -> Body:
            count = split(args.steps, args.workers)[index]
            if shape == "dbos_step_in_workflow":
                def body() -> list[float]:
                    done = many_steps(index, count, deadline)
                    if done < count:
                        hit.set()
                    return step_latencies.get(index, [])
            else:
                body = timed_body(count, deadline, hit, lambda i: one_step(index, i))
            return body

        latencies, elapsed, cpu_s = run_workers(args.workers, prepare)
        workload_end = time.perf_counter()
    finally:
        DBOS.destroy(destroy_registry=True)
    quiesced = counters.quiesce()
    after = counters.settled_snapshot()
    # Subtract DBOS's background polling (queue and maintenance threads), measured while idle just
    # before the window, for the time between the first read and the end of the workload.
    idle_seconds = before.at - idle_start.at
    bg_xacts_per_s = (before.xacts - idle_start.xacts) / idle_seconds
    bg_rows_per_s = (before.rows_written - idle_start.rows_written) / idle_seconds
    window = workload_end - before.at
    raw = summarize(
        system="dbos", scenario=shape.removeprefix("dbos_"), workers=args.workers, latencies=latencies, elapsed=elapsed, cpu_s=cpu_s,
        before=before, after=after, counters=counters, quiesced=quiesced, deadline_hit=hit.is_set(),
    )
    steps = raw["steps"] or 1
    corrected_xacts = raw["xacts"] - bg_xacts_per_s * window
    corrected_rows = raw["rows_written"] - bg_rows_per_s * window
    raw.update(
        xacts_per_step_raw=raw["xacts_per_step"],
        xacts_per_step=round(corrected_xacts / steps, 3),
        rows_written_per_step_raw=raw["rows_written_per_step"],
        rows_written_per_step=round(corrected_rows / steps, 3),
        background_xacts_per_s=round(bg_xacts_per_s, 2),
        background_rows_per_s=round(bg_rows_per_s, 2),
    )
    return raw


# ---------------------------------------------------------------- LangGraph
class GraphState(TypedDict):
    """LangGraph's state for one worker: a step counter (module level: LangGraph resolves the
    node's type hints at compile time)."""

    step: int
    limit: int
    worker: int


def run_langgraph(args: argparse.Namespace, counters: Counters) -> dict[str, Any]:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph

    durability = "sync" if args.scenario == "langgraph_sync" else "async"

    def build(saver: PostgresSaver, marks: list[float], deadline: float) -> Any:
        def work(state: GraphState) -> dict[str, int]:
            marks.append(time.perf_counter())
            return {"step": state["step"] + 1}

        def route(state: GraphState) -> str:
            return "work" if state["step"] < state["limit"] and time.perf_counter() <= deadline else END

        builder = StateGraph(GraphState)
        builder.add_node("work", work)
        builder.add_edge(START, "work")
        builder.add_conditional_edges("work", route, ["work", END])
        return builder.compile(checkpointer=saver)

    def invoke(saver: PostgresSaver, worker: int, count: int, deadline: float) -> list[float]:
        """One graph run of ``count`` supersteps; returns one duration per superstep.

        A superstep's duration runs from one node entry to the next (the node, then the
        checkpoint of its result); the last one ends when ``invoke`` returns. The time before the
        first node (reading the thread, writing the input checkpoint) is left out of the per-step
        latencies but stays in the wall time and the transaction counts.
        """
        marks: list[float] = []
        graph = build(saver, marks, deadline)
        config = {"configurable": {"thread_id": f"w{worker}-{uuid.uuid4().hex}"}, "recursion_limit": count + 10}
        graph.invoke({"step": 0, "limit": count, "worker": worker}, config, durability=durability)
        end = time.perf_counter()
        points = marks + [end]
        return [b - a for a, b in zip(points, points[1:])]

    with PostgresSaver.from_conn_string(args.db_url) as saver:
        saver.setup()
        invoke(saver, -1, WARMUP_STEPS, time.perf_counter() + 60)
    quiesced = counters.quiesce()
    before = counters.settled_snapshot()
    deadline = time.perf_counter() + args.max_seconds
    hit = threading.Event()

    def prepare(index: int) -> Body:
        # One connection and one saver per worker: PostgresSaver serialises every call on one
        # instance with a lock, so a shared saver would make the workers queue behind each other.
        cm = PostgresSaver.from_conn_string(args.db_url)
        saver = cm.__enter__()
        count = split(args.steps, args.workers)[index]

        def body() -> list[float]:
            try:
                latencies = invoke(saver, index, count, deadline)
            finally:
                cm.__exit__(None, None, None)
            if len(latencies) < count:
                hit.set()
            return latencies

        return body

    latencies, elapsed, cpu_s = run_workers(args.workers, prepare)
    quiesced = counters.quiesce() and quiesced
    after = counters.settled_snapshot()
    return summarize(
        system="langgraph", scenario=f"superstep_{durability}", workers=args.workers, latencies=latencies,
        elapsed=elapsed, cpu_s=cpu_s, before=before, after=after, counters=counters, quiesced=quiesced, deadline_hit=hit.is_set(),
        extra={"durability": durability},
    )


SCENARIOS: dict[str, Callable[[argparse.Namespace, Counters], dict[str, Any]]] = {
    "floor": run_floor,
    "ours_action": run_ours_action,
    "ours_api": run_ours_api,
    "ours_api_tuned": run_ours_api,
    "dbos_step_in_workflow": run_dbos,
    "dbos_workflow_per_step": run_dbos,
    "langgraph_sync": run_langgraph,
    "langgraph_async": run_langgraph,
    "http": run_http,
}


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--_subscribe":
        return _subscribe_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    parser.add_argument("--db-url", required=True, help="URL of the database this system uses")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=60.0, help="stop the measured steps after this long")
    parser.add_argument("--kind", choices=["floor", "single", "batch"], default="single", help="http: what one request is")
    parser.add_argument("--server", choices=["daphne", "uvicorn"], default="daphne", help="http: the server")
    parser.add_argument("--server-workers", type=int, default=1, help="http, uvicorn: processes behind the port")
    parser.add_argument("--lean", type=int, default=1, help="http: API_LEAN (1: the lean /api/v1/ path)")
    parser.add_argument("--subscribers", type=int, default=0, help="http: websocket subscribers on the project")
    parser.add_argument("--redis-url", default="", help="http: REDIS_URL for the server (channel layer)")
    parser.add_argument("--rss-after", type=float, default=0.0, help="http: take the RSS start sample this far into the window")
    parser.add_argument("--pages", type=float, default=0.0,
                        help="http: a manager loads the dashboard, a session page and the events every this many seconds (0: no pages)")
    parser.add_argument("--fast", action="store_true", help="dbos: skip the idle waits that only the counters need")
    parser.add_argument("--log-file", default=str(BENCH_DIR / "results" / "daphne.log"), help="where daphne writes (API scenarios)")
    args = parser.parse_args()
    dbname = args.db_url.rsplit("/", 1)[-1].split("?", 1)[0]
    counters = Counters(args.db_url, dbname)
    try:
        result = SCENARIOS[args.scenario](args, counters)
    except ImportError as exc:
        result = {"scenario": args.scenario, "skipped": f"cannot import: {exc}"}
    except Exception as exc:
        traceback.print_exc()
        result = {"scenario": args.scenario, "error": f"{type(exc).__name__}: {exc}"}
    result["scenario_id"] = args.scenario
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
