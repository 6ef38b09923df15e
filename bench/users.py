"""One user workload per process: ``python bench/users.py --workload NAME --db-url URL ...``.

Run by ``bench/run.py`` inside ``bench/.venv``. A workload is what a user runs: ``--clients``
agents (default 8), each its own **process** (forked from this one, the same for every system),
each doing durable steps in a loop on its own run / thread / workflow for a fixed measured window
(``--seconds``). The verdict figure is **steps per second of the whole workload**; beside it the
**whole machine's CPU per step**: busy jiffies of every process (``/proc/stat``'s ``cpu`` line:
user, nice, system, irq, softirq, steal) over the window, divided by the steps. Client, server,
PostgreSQL (and the MCP servers, for ``mcp``) all run on this machine's cores, so their costs are
in it. The server's own CPU (daphne, from ``/proc/<pid>/stat``) is printed as a diagnostic only.

Workloads (bench/README.md says why each is what a user runs):

- ``client``: ``novelforge_client.Client.checkpoint(run_id, ...)`` as shipped (a fresh
  idempotency key per call), one open run per client, against daphne as ``make run`` serves;
- ``raw``: ``POST /api/v1/runs/{id}/checkpoints`` without a key, over ``http.client`` (reference);
- ``batch``: ``POST /api/v1/runs/{id}/batch`` of 10 checkpoints, counted per checkpoint (reference);
- ``mcp``: the ``checkpoint`` tool of ``novelforge-mcp``, each client an SDK ``mcp.Client``
  that launches its own ``python -m novelforge_client.mcp_server`` over stdio, as a host does;
- ``langgraph_ours`` / ``langgraph_pg``: one LangGraph graph (one node looping on itself, one
  superstep = one step), ``durability="sync"``, on ``NovelForgeSaver`` / ``PostgresSaver``;
- ``langgraph_ours_async`` / ``langgraph_pg_async``: the same graph run with ``ainvoke``, on
  ``NovelForgeSaver``'s async methods / ``AsyncPostgresSaver``;
- ``dbos``: a DBOS workflow looping over a ``@DBOS.step()``;
- ``floor``: ``bench/floorapp``'s one-insert django-ninja endpoint, served exactly as ours.

Two write counts (``--workload p2|p3``) print the same ``RESULT`` line; see ``count_p2``/``count_p3``.

Each client warms up (``WARMUP_STEPS`` steps) and keeps stepping; once every client is warm the
window opens 0.5 s later and lasts ``--seconds``. A step counts if it completes inside the window.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

from daphne_server import Daphne, process_tree  # noqa: E402  (root and every process below it)

WARMUP_STEPS = 5
BATCH_SIZE = 10
P2_TRIES = 7
READY_TIMEOUT_S = 180.0
#: Clients keep stepping this long after the window closes (their steps then are not counted), so
#: that the window's last CPU samples see the whole load, every client's PostgreSQL backend still
#: connected: a backend that exits before it is sampled takes its CPU out of "own CPU".
TAIL_S = 0.5
#: The environment our server runs with: `make run`'s (DB_POOL_MAX_SIZE=10, the lean API path).
SERVER_ENV = {"DB_POOL_MAX_SIZE": "10", "API_LEAN": "true", "LIVE_SWEEP_SECONDS": "60"}
WORKLOADS = ("client", "raw", "batch", "mcp", "langgraph_ours", "langgraph_pg", "langgraph_ours_async",
             "langgraph_pg_async", "dbos", "floor", "stream_on")
ON_OUR_SERVER = {"client", "raw", "batch", "mcp", "langgraph_ours", "langgraph_ours_async", "stream_on"}
#: stream_on: `raw` with this many websocket subscribers on the project (P5), in a process of their own.
SUBSCRIBERS = 10


# ---------------------------------------------------------------- the machine
def machine_busy_jiffies() -> int:
    """Busy jiffies of the whole machine so far, all CPUs: ``/proc/stat``'s ``cpu`` line minus idle
    and iowait (guest time is already inside user)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal


#: The PostgreSQL backends seen by :func:`own_cpu_ticks` (for the database's share of own CPU).
_BACKENDS: set[int] = set()


def own_cpu_ticks(db_url: str) -> dict[int, int]:
    """CPU ticks so far of this workload's processes and of the PostgreSQL backends connected to
    its database (by pid): the diagnostic "own CPU", which another tenant of the machine does not
    inflate. PostgreSQL's background writers are not in it."""
    import psycopg

    dbname = db_url.rsplit("/", 1)[1].split("?", 1)[0]
    with psycopg.connect(db_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        backends = [int(r[0]) for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (dbname,)).fetchall()]
    ticks = {}
    _BACKENDS.update(backends)
    for pid in process_tree(os.getpid()) + backends:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone, or another machine's PostgreSQL
        ticks[pid] = int(fields[11]) + int(fields[12])
    return ticks


# ---------------------------------------------------------------- one client's clock
class Clock:
    """Counts one client's steps inside the shared window (``window[0]`` start, ``window[1]`` end,
    0 until the parent opens it) and says when to stop (``TAIL_S`` after the window's end)."""

    def __init__(self, window: Any, ready: Any, index: int) -> None:
        self.window, self.ready, self.index = window, ready, index
        self.total = 0
        self.steps = 0
        self.latencies: list[float] = []
        self.last = time.monotonic()
        self.warm = False

    def done(self, n: int = 1) -> None:
        """One step (``n`` checkpoints) just completed."""
        now = time.monotonic()
        start, end = self.window[0], self.window[1]
        if start and start <= now < end:
            self.steps += n
            self.latencies.append(now - self.last)
        self.last = now
        self.total += 1
        if not self.warm and self.total >= WARMUP_STEPS:
            self.warm = True
            self.ready.put(("ready", self.index))

    def running(self) -> bool:
        end = self.window[1]
        return not end or time.monotonic() < end + TAIL_S

    def restart(self) -> None:
        """The next step's latency starts now (after a client's own set-up between steps)."""
        self.last = time.monotonic()


def loop(clock: Clock, step: Callable[[int], int]) -> None:
    i = 0
    clock.restart()
    while clock.running():
        clock.done(step(i))
        i += 1


def cursor(worker: int, step: int) -> dict[str, Any]:
    return {"step": step, "worker": worker}


# ---------------------------------------------------------------- the workloads (one client each)
def w_client(p: dict[str, Any], index: int, clock: Clock) -> None:
    from novelforge_client import Client

    run_id = p["run_ids"][index]
    with Client(p["url"], p["token"]) as nf:
        loop(clock, lambda i: (nf.checkpoint(run_id, boundary="context_freeze", cursor=cursor(index, i)), 1)[1])


def _http_loop(p: dict[str, Any], index: int, clock: Clock, request: Callable[[int], tuple[str, str, int]]) -> None:
    import http.client
    from urllib.parse import urlsplit

    api = urlsplit(p["url"])
    headers = {"Content-Type": "application/json"}
    if p.get("token"):
        headers["Authorization"] = f"Bearer {p['token']}"
    conn = http.client.HTTPConnection(api.hostname, api.port, timeout=30)

    def step(i: int) -> int:
        path, body, n = request(i)
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
        if resp.status != 201:
            raise RuntimeError(f"{path} answered {resp.status}: {payload[:300]!r}")
        return n

    try:
        loop(clock, step)
    finally:
        conn.close()


def w_raw(p: dict[str, Any], index: int, clock: Clock) -> None:
    path = f"/api/v1/runs/{p['run_ids'][index]}/checkpoints"
    _http_loop(p, index, clock, lambda i: (path, json.dumps({"boundary": "context_freeze", "cursor": cursor(index, i)}), 1))


def w_batch(p: dict[str, Any], index: int, clock: Clock) -> None:
    path = f"/api/v1/runs/{p['run_ids'][index]}/batch"

    def request(i: int) -> tuple[str, str, int]:
        items = [{"kind": "checkpoint", "checkpoint": {"boundary": "context_freeze", "cursor": cursor(index, i * BATCH_SIZE + k)}}
                 for k in range(BATCH_SIZE)]
        return path, json.dumps({"items": items}), BATCH_SIZE

    _http_loop(p, index, clock, request)


def w_floor(p: dict[str, Any], index: int, clock: Clock) -> None:
    _http_loop(p, index, clock, lambda i: ("/api/v1/floor", json.dumps({"cursor": cursor(index, i)}), 1))


def w_mcp(p: dict[str, Any], index: int, clock: Clock) -> None:
    from mcp import Client, StdioServerParameters

    run_id = p["run_ids"][index]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
           "NOVELFORGE_URL": p["url"], "NOVELFORGE_TOKEN": p["token"]}
    server = StdioServerParameters(command=sys.executable, args=["-m", "novelforge_client.mcp_server"], env=env, cwd=str(ROOT))

    async def main() -> None:
        async with Client(server) as c:
            i = 0
            clock.restart()
            while clock.running():
                result = await c.call_tool("checkpoint", {"run_id": run_id, "boundary": "context_freeze",
                                                          "cursor": cursor(index, i)})
                if result.is_error:
                    raise RuntimeError(f"checkpoint tool refused: {result.structured_content}")
                clock.done()
                i += 1

    asyncio.run(main())


class GraphState(TypedDict):
    """The loop graph's state (module level: LangGraph resolves the node's type hints)."""

    step: int
    worker: int


def _loop_graph(saver: Any, clock: Clock) -> Any:
    from langgraph.graph import END, START, StateGraph

    def work(state: GraphState) -> dict[str, int]:
        # Entering the node again means the previous superstep, checkpoint included, completed.
        clock.done()
        return {"step": state["step"] + 1}

    def route(state: GraphState) -> str:
        return "work" if clock.running() else END

    builder = StateGraph(GraphState)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    builder.add_conditional_edges("work", route, ["work", END])
    return builder.compile(checkpointer=saver)


def _started(saver: Any, index: int, clock: Clock) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The loop graph on ``saver``, its input and a new thread's config; the clock restarted."""
    graph = _loop_graph(saver, clock)
    config = {"configurable": {"thread_id": f"bench-w{index}-{uuid.uuid4().hex}"}, "recursion_limit": 10**9}
    clock.restart()
    return graph, {"step": 0, "worker": index}, config


def _invoke(saver: Any, index: int, clock: Clock) -> None:
    graph, inputs, config = _started(saver, index, clock)
    graph.invoke(inputs, config, durability="sync")


def w_langgraph_ours(p: dict[str, Any], index: int, clock: Clock) -> None:
    from novelforge_client.langgraph import NovelForgeSaver

    saver = NovelForgeSaver(url=p["url"], token=p["token"])
    try:
        _invoke(saver, index, clock)
    finally:
        saver.close()


def w_langgraph_pg(p: dict[str, Any], index: int, clock: Clock) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(p["db_url"]) as saver:
        _invoke(saver, index, clock)


async def _ainvoke(saver: Any, index: int, clock: Clock) -> None:
    graph, inputs, config = _started(saver, index, clock)
    await graph.ainvoke(inputs, config, durability="sync")


def w_langgraph_ours_async(p: dict[str, Any], index: int, clock: Clock) -> None:
    from novelforge_client.langgraph import NovelForgeSaver

    async def main() -> None:
        saver = NovelForgeSaver(url=p["url"], token=p["token"])
        try:
            await _ainvoke(saver, index, clock)
        finally:
            await saver.aclose()

    asyncio.run(main())


def w_langgraph_pg_async(p: dict[str, Any], index: int, clock: Clock) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async def main() -> None:
        async with AsyncPostgresSaver.from_conn_string(p["db_url"]) as saver:
            await _ainvoke(saver, index, clock)

    asyncio.run(main())


_dbos_clock: list[Clock] = []


def w_dbos(p: dict[str, Any], index: int, clock: Clock) -> None:
    from dbos import DBOS, DBOSConfig

    _dbos_clock.append(clock)
    # Each client process is its own DBOS executor (its own id), so that no process recovers
    # another's workflows at launch.
    config: DBOSConfig = {"name": "nfbench", "system_database_url": p["db_url"], "log_level": "WARNING",
                          "executor_id": f"bench-{index}-{uuid.uuid4().hex[:8]}"}
    DBOS(config=config)

    @DBOS.step()
    def durable_step(worker: int, step: int) -> dict[str, int]:
        return cursor(worker, step)

    @DBOS.workflow()
    def steps(worker: int) -> int:
        c = _dbos_clock[0]
        i = 0
        c.restart()
        while c.running():
            durable_step(worker, i)
            c.done()
            i += 1
        return i

    DBOS.launch()
    try:
        steps(index)
    finally:
        DBOS.destroy(destroy_registry=True)


def prime_langgraph_pg(db_url: str) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(db_url) as saver:
        saver.setup()


def prime_dbos(db_url: str) -> None:
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {"name": "nfbench", "system_database_url": db_url, "log_level": "WARNING",
                          "executor_id": f"bench-prime-{uuid.uuid4().hex[:8]}"}
    DBOS(config=config)
    DBOS.launch()
    DBOS.destroy(destroy_registry=True)


PRIME: dict[str, Callable[[str], None]] = {"langgraph_pg": prime_langgraph_pg, "langgraph_pg_async": prime_langgraph_pg,
                                           "dbos": prime_dbos}

CLIENTS: dict[str, Callable[[dict[str, Any], int, Clock], None]] = {
    "client": w_client, "raw": w_raw, "batch": w_batch, "mcp": w_mcp, "langgraph_ours": w_langgraph_ours,
    "langgraph_pg": w_langgraph_pg, "langgraph_ours_async": w_langgraph_ours_async,
    "langgraph_pg_async": w_langgraph_pg_async, "dbos": w_dbos, "floor": w_floor, "stream_on": w_raw,
}


def client_main(name: str, params: dict[str, Any], index: int, window: Any, ready: Any) -> None:
    clock = Clock(window, ready, index)
    try:
        CLIENTS[name](params, index, clock)
        ready.put(("done", index, clock.steps, clock.latencies, clock.total))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the workload
        traceback.print_exc()
        ready.put(("error", index, f"{type(exc).__name__}: {exc}"[:500]))


# ---------------------------------------------------------------- set-up of ours
def setup_django(db_url: str) -> None:
    os.environ["DATABASE_URL"] = db_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "novelforge_sessions.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def ours_fixture(label: str, runs: int) -> tuple[str, list[int], int]:
    """A fresh project, an all-permission token, and ``runs`` sessions each with an open run."""
    from django.db import connections

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
    caller = caller_for_token(raw)
    assert caller is not None
    spec = NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="claude-code")
    runtime = RuntimeSpec(runtime_family="claude-code", capabilities=["draft"], lease_seconds=3600)
    run_ids = []
    for _ in range(runs):
        session = create_session(caller, spec, runtime=runtime)
        run_ids.append(start_run(caller, session.id, cursor={"step": "start"}).id)
    connections.close_all()  # nothing open when the clients fork
    return raw, run_ids, project.id


#: The server the workloads run on (``--server``): ``uvicorn`` as production serves
#: (``python -m novelforge_sessions.serve``), or ``daphne`` as ``make run`` serves.
SERVER = ["uvicorn"]
#: Server processes (``--workers``): uvicorn's own supervisor behind one port.
WORKERS = [1]


def start_server(name: str, db_url: str, log_file: Path) -> Daphne:
    if name == "floor":
        return Daphne(db_url, log_file, extra_env=SERVER_ENV, app="floorapp.asgi:application", settings="floorapp.settings",
                      server=SERVER[0], workers=WORKERS[0])
    return Daphne(db_url, log_file, extra_env=SERVER_ENV, server=SERVER[0], workers=WORKERS[0])


# ---------------------------------------------------------------- one workload
def run_workload(args: argparse.Namespace) -> dict[str, Any]:
    name = args.workload
    params: dict[str, Any] = {"db_url": args.db_url}
    server: Daphne | None = None
    if name in ON_OUR_SERVER or name == "floor":
        setup_django(args.db_url)
        if name == "floor":
            from django.db import connections

            with connections["default"].cursor() as cur:
                cur.execute("CREATE TABLE IF NOT EXISTS bench_floor_api (id bigserial PRIMARY KEY, cursor jsonb NOT NULL)")
            connections.close_all()
        else:
            params["token"], params["run_ids"], project_id = ours_fixture(name, args.clients)
        server = start_server(name, args.db_url, Path(args.log_file))
        params["url"] = server.url
    ctx = mp.get_context("fork")
    if name in PRIME:  # the peer's own schema, made once before the clients start
        primer = ctx.Process(target=PRIME[name], args=(args.db_url,), name=f"bench-{name}-prime")
        primer.start()
        primer.join(timeout=120)
        if primer.exitcode != 0:
            raise RuntimeError(f"{name}: preparing its database failed (exit {primer.exitcode})")
    window = ctx.Array("d", [0.0, 0.0], lock=False)
    ready = ctx.Queue()
    procs = [ctx.Process(target=client_main, args=(name, params, i, window, ready), name=f"bench-{name}-{i}")
             for i in range(args.clients)]
    results: dict[int, tuple[int, list[float], int]] = {}
    errors: list[str] = []
    subs = None
    events: tuple[int, int] = (0, 0)
    try:
        if name == "stream_on":
            from workloads import _subscribers

            assert server is not None
            subs = _subscribers(server.url, params["token"], project_id, SUBSCRIBERS)
        for proc in procs:
            proc.start()
        warm: set[int] = set()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(warm) < args.clients and not errors:
            try:
                msg = ready.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"only {len(warm)} of {args.clients} clients warmed up in {READY_TIMEOUT_S:.0f} s") from None
            if msg[0] == "ready":
                warm.add(msg[1])
            elif msg[0] == "error":
                errors.append(f"client {msg[1]}: {msg[2]}")
        if errors:
            raise RuntimeError(errors[0])
        start = time.monotonic() + 0.5
        window[0], window[1] = start, start + args.seconds
        time.sleep(max(0.0, start - time.monotonic()))
        busy0, server0, load0 = machine_busy_jiffies(), server.cpu_seconds() if server else 0.0, os.getloadavg()[0]
        own0 = own_cpu_ticks(args.db_url)
        time.sleep(max(0.0, window[1] - time.monotonic()))
        busy1, server1 = machine_busy_jiffies(), server.cpu_seconds() if server else 0.0
        own1 = own_cpu_ticks(args.db_url)
        elapsed = window[1] - window[0]
        while len(results) < args.clients:
            try:
                msg = ready.get(timeout=60)
            except queue.Empty:
                raise RuntimeError(f"only {len(results)} of {args.clients} clients reported after the window") from None
            if msg[0] == "done":
                results[msg[1]] = (msg[2], msg[3], msg[4])
            elif msg[0] == "error":
                raise RuntimeError(f"client {msg[1]}: {msg[2]}")
    finally:
        window[1] = window[1] or time.monotonic()  # a client still warming up stops too
        for proc in procs:
            proc.join(timeout=20)
            if proc.is_alive():
                proc.kill()
                proc.join()
        try:
            if subs is not None:
                from workloads import _subscribers_stop

                # every event committed since they subscribed (warm-up and after the window too)
                events = _subscribers_stop(subs, sum(r[2] for r in results.values()) * SUBSCRIBERS)
        finally:
            if server is not None:
                server.stop()
    steps = sum(r[0] for r in results.values())
    if not steps:
        raise RuntimeError("no step completed inside the window")
    latencies = sorted(x for r in results.values() for x in r[1])
    hz = os.sysconf("SC_CLK_TCK")
    busy_s = (busy1 - busy0) / hz
    own_s = sum(t - own0.get(pid, 0) for pid, t in own1.items()) / hz
    db_s = sum(t - own0.get(pid, 0) for pid, t in own1.items() if pid in _BACKENDS) / hz
    return {
        "workload": name, "clients": args.clients, "seconds": round(elapsed, 3), "steps": steps,
        "steps_per_s": round(steps / elapsed, 1),
        "machine_cpu_ms_per_step": round(busy_s / steps * 1000, 3),
        "machine_busy_cores": round(busy_s / elapsed, 2),
        "server_cpu_ms_per_step": round((server1 - server0) / steps * 1000, 3) if server else None,
        "own_cpu_ms_per_step": round(own_s / steps * 1000, 3),
        "db_cpu_ms_per_step": round(db_s / steps * 1000, 3),
        "per_client_steps": [results[i][0] for i in sorted(results)],
        "latency_ms": {"p50": round(statistics.median(latencies) * 1000, 2),
                       "p99": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 2)},
        "loadavg_1m": round(load0, 2), "cpus": os.cpu_count(),
        **({"subscribers": SUBSCRIBERS, "events_received": events[0], "frames_received": events[1],
            "events_expected": sum(r[2] for r in results.values()) * SUBSCRIBERS} if name == "stream_on" else {}),
    }


# ---------------------------------------------------------------- write counts (P2, P3)
def table_writes(db_url: str) -> dict[str, int]:
    """``n_tup_ins + n_tup_upd + n_tup_del`` per table of the database (flushed counts)."""
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute("SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables").fetchall()
    return {name: int(n) for name, n in rows}


def next_xid(admin_url: str) -> int:
    """The cluster's next transaction id, read without taking one (``pg_current_snapshot``'s xmax)."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        return int(conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()[0])


def quiesce(admin_url: str, dbname: str, timeout: float = 30.0) -> None:
    """Wait until no backend is connected to ``dbname``: every backend has exited, and so flushed
    its statistics (PostgreSQL ≥ 15 flushes a backend's counts when it exits)."""
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(admin_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            n = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                             (dbname,)).fetchone()[0]
            if n == 0:
                return
            time.sleep(0.05)
    raise RuntimeError(f"database {dbname} did not go quiet")


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {t: after.get(t, 0) - before.get(t, 0) for t in after if after.get(t, 0) != before.get(t, 0)}


def writer_xids(db_url: str, low: int, high: int) -> int:
    """Distinct ``xmin`` in [low, high) over every table of the database: the write transactions
    of that span whose rows are still visible (exact for inserted rows)."""
    import psycopg

    mod = 2**32
    lo, hi = low % mod, high % mod
    if hi < lo:
        return -1  # the 32-bit xid wrapped inside the span: not counted
    xids: set[int] = set()
    with psycopg.connect(db_url, autocommit=True) as conn:
        tables = conn.execute("SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables").fetchall()
        for (table,) in tables:
            rows = conn.execute(f"SELECT DISTINCT xmin::text::bigint FROM {table} "  # noqa: S608 - names from the catalog
                                "WHERE xmin::text::bigint >= %s AND xmin::text::bigint < %s", (lo, hi)).fetchall()
            xids.update(int(r[0]) for r in rows)
    return len(xids)


def count_p2(args: argparse.Namespace) -> dict[str, Any]:
    """P2: write transactions per ``Client.checkpoint()``, counted on the server.

    Every transaction that writes takes a transaction id; read-only ones (the token lookup, for
    instance) take none. One client makes ``--count`` checkpoints one after another while the
    cluster's next xid (``pg_current_snapshot()``'s xmax, read without taking one) is read before
    and after, ``P2_TRIES`` times. The figure: the distinct ``xmin`` among the rows of our
    database stamped with an xid of that span, per checkpoint (the highest try). Every
    checkpoint's rows are inserted (the checkpoint and its event) and the run's row is updated,
    so each write transaction that made or touched them is seen, the run's last update included;
    the per-table counts (``pg_stat_user_tables``, flushed when the server stops) say that no
    other row was written. Its blind spot: a transaction whose every row version a later step
    overwrote (not the last step's). Cross-check, never the verdict: the xids the whole cluster
    took meanwhile (the lowest try), which anything else writing on this shared cluster inflates.
    """
    from novelforge_client import Client

    setup_django(args.db_url)
    token, run_ids, _ = ours_fixture("p2", 1)
    admin = args.db_url.rsplit("/", 1)[0] + "/postgres"
    dbname = args.db_url.rsplit("/", 1)[1].split("?", 1)[0]
    quiesce(admin, dbname)
    rows_before = table_writes(args.db_url)
    server = start_server("client", args.db_url, Path(args.log_file))
    upper, lower, made = [], [], 0
    try:
        with Client(server.url, token) as nf:
            for i in range(WARMUP_STEPS):
                nf.checkpoint(run_ids[0], boundary="context_freeze", cursor=cursor(0, i))
            made += WARMUP_STEPS
            for t in range(P2_TRIES):
                x0 = next_xid(admin)
                for i in range(args.count):
                    nf.checkpoint(run_ids[0], boundary="context_freeze", cursor=cursor(t, i))
                x1 = next_xid(admin)
                made += args.count
                upper.append(x1 - x0)
                lower.append(writer_xids(args.db_url, x0, x1))
    finally:
        server.stop()
    quiesce(admin, dbname)
    rows = delta(rows_before, table_writes(args.db_url))
    return {"workload": "p2", "checkpoints_per_try": args.count, "cluster_xids_per_try": upper, "our_writer_xids_per_try": lower,
            "write_xacts_per_checkpoint": round(max(lower) / args.count, 3),
            "cluster_xids_per_checkpoint": round(min(upper) / args.count, 3),
            "checkpoints_made": made, "rows_per_checkpoint": {t: round(n / made, 3) for t, n in sorted(rows.items())}}


def count_p3(args: argparse.Namespace) -> dict[str, Any]:
    """P3: what an ``already_consumed`` replay of a result delivery writes, counted on the server.

    A handoff is made, claimed and delivered once with the shipped client; the server is stopped
    and the database left to go quiet (every backend exited and flushed its counts), then
    ``pg_stat_user_tables`` is read; a server is started again, the same delivery is replayed
    ``--count`` times (each answered ``already_consumed``), the server is stopped, the counts read
    again. The same start/stop with ``--count`` reads of the handoff instead is the baseline
    (what serving requests writes anyway); rows per replay = (replays − baseline) / count.
    """
    from novelforge_client import Client

    setup_django(args.db_url)
    token, run_ids, _ = ours_fixture("p3", 1)
    admin = args.db_url.rsplit("/", 1)[0] + "/postgres"
    dbname = args.db_url.rsplit("/", 1)[1].split("?", 1)[0]
    log_file = Path(args.log_file)

    def with_server(fn: Callable[[Client], Any]) -> tuple[Any, dict[str, int]]:
        quiesce(admin, dbname)
        before = table_writes(args.db_url)
        server = start_server("client", args.db_url, log_file)
        try:
            with Client(server.url, token) as nf:
                out = fn(nf)
        finally:
            server.stop()
        quiesce(admin, dbname)
        return out, delta(before, table_writes(args.db_url))

    def first(nf: Client) -> dict[str, Any]:
        job = nf.hand_off(run_ids[0], f"bench-p3-{uuid.uuid4().hex[:8]}", required_capabilities=["bench"], timeout_seconds=600)
        lease = nf.claim("bench-worker", ["bench"], handoff_id=job.id)
        assert lease is not None
        out = nf.deliver(job.id, fencing_token=lease.fencing_token, job_fingerprint=job.job_fingerprint, result={"ok": True})
        assert out.outcome == "consumed", out.outcome
        return {"id": job.id, "token": lease.fencing_token, "fp": job.job_fingerprint}

    job, _ = with_server(first)

    def replays(nf: Client) -> list[str]:
        return [nf.deliver(job["id"], fencing_token=job["token"], job_fingerprint=job["fp"], result={"ok": True}).outcome
                for _ in range(args.count)]

    def reads(nf: Client) -> list[str]:
        return [nf.handoff(job["id"]).state for _ in range(args.count)]

    _, baseline = with_server(reads)
    outcomes, replayed = with_server(replays)
    if set(outcomes) != {"already_consumed"}:
        raise RuntimeError(f"replays answered {sorted(set(outcomes))}")
    tables = sorted(set(baseline) | set(replayed))
    per = {t: round((replayed.get(t, 0) - baseline.get(t, 0)) / args.count, 3) for t in tables}
    per = {t: v for t, v in per.items() if v}
    return {"workload": "p3", "replays": args.count, "rows_per_replay": round(sum(per.values()), 3),
            "rows_per_replay_by_table": per, "baseline_rows": baseline, "replay_rows": replayed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, "p2", "p3"], required=True)
    parser.add_argument("--db-url", required=True, help="the database this system uses")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--server", choices=["uvicorn", "daphne"], default="uvicorn",
                        help="uvicorn: the production server (python -m novelforge_sessions.serve); daphne: as make run serves")
    parser.add_argument("--workers", type=int, default=1,
                        help="server processes (uvicorn only): 2 = one per core, as make serve-cluster runs")
    parser.add_argument("--seconds", type=float, default=10.0, help="the measured window")
    parser.add_argument("--count", type=int, default=100, help="p2: checkpoints per try; p3: replays")
    parser.add_argument("--log-file", default=str(BENCH_DIR / "results" / "users.log"), help="where servers write")
    args = parser.parse_args()
    SERVER[0] = args.server
    WORKERS[0] = args.workers
    try:
        if args.workload == "p2":
            result = count_p2(args)
        elif args.workload == "p3":
            result = count_p3(args)
        else:
            result = run_workload(args)
    except ImportError as exc:
        traceback.print_exc()
        result = {"workload": args.workload, "skipped": f"cannot import: {exc}"}
    except Exception as exc:
        traceback.print_exc()
        result = {"workload": args.workload, "error": f"{type(exc).__name__}: {exc}"[:500]}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
