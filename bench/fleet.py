"""The fleet: how many agents one server holds, as they behave (informational, full run only).

    python bench/fleet.py [--hold 120] [--ladder 100,200,400,800,1600] [--dashboards 50]

N simulated agents, each through the shipped ``novelforge_client.AsyncClient`` with a client of
its own, each on its own session (with a live runtime) and open run: a checkpoint every 5 s and a
heartbeat every 10 s (their first ones spread over the period, after one unmeasured heartbeat that
opens each client's connection), in ``AGENT_PROCESSES`` processes;
plus ``--dashboards`` websockets subscribed to the project as the dashboard is (batched frames),
in a process of their own. Our server is the goals table's (``--server``, from ``run.py``'s
``--server`` through ``NFBENCH_SERVER``): uvicorn as production serves it, or daphne as ``make run``
does, with ``bench/users.py``'s ``SERVER_ENV``; everything on this machine. A level of N **holds** when,
over ``--hold`` seconds, every request succeeded, the p99 of every request's latency is ≤ 50 ms,
and every dashboard received every event the project committed meanwhile (no gap). The ladder
stops at the first level that does not hold; the row is the largest N that held.

As a plug-in of ``bench/run.py`` (``goals(quick, server_url)``) it runs in the full run only;
``--quick`` gives one row saying so. Its database is ``<NFBENCH_DB_PREFIX>_fleet``.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

CHECKPOINT_EVERY_S = 5.0
HEARTBEAT_EVERY_S = 10.0
P99_LIMIT_MS = 50.0
AGENT_PROCESSES = 2
DBNAME = os.environ.get("NFBENCH_DB_PREFIX", "nfbench") + "_fleet"


def log(message: str) -> None:
    print(f"[fleet] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the agents' processes
def agents_main(url: str, token: str, spec_path: str, hold: float) -> int:
    """``--_agents``: every agent of ``spec_path`` (a JSON list of [runtime_id, run_id]) for
    ``hold`` seconds; prints ``RESULT {latencies_ms, errors, requests}``."""
    from novelforge_client import AsyncClient

    agents = json.loads(Path(spec_path).read_text())
    latencies: list[float] = []
    errors: list[str] = []

    async def agent(runtime_id: int, run_id: int, warm: asyncio.Semaphore, ready: list[int],
                    begin: asyncio.Event, span: list[float]) -> None:
        async with AsyncClient(url, token) as c:
            async with warm:  # its connection opened, unmeasured: a fleet in steady state has them
                await c.heartbeat(runtime_id)
            ready[0] += 1
            if ready[0] == len(agents):
                # Every client's connection is open: what is alive now lives for the whole hold.
                # Frozen out of the collector's reach, so that this process (hundreds of agents,
                # where each real one runs on its own) does not stop them all for a full
                # collection of every client's objects in the middle of the measurement.
                gc.collect()
                gc.freeze()
                span[:] = [time.monotonic(), time.monotonic() + hold]
                begin.set()
            await begin.wait()
            end = span[1]
            now = time.monotonic()
            next_cp = now + random.uniform(0, CHECKPOINT_EVERY_S)
            next_hb = now + random.uniform(0, HEARTBEAT_EVERY_S)
            i = 0
            while True:
                due = min(next_cp, next_hb)
                if due >= end:
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                t0 = time.monotonic()
                try:
                    if due == next_cp:
                        await c.checkpoint(run_id, boundary="context_freeze", cursor={"step": i})
                        next_cp += CHECKPOINT_EVERY_S
                        i += 1
                    else:
                        await c.heartbeat(runtime_id)
                        next_hb += HEARTBEAT_EVERY_S
                except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the fleet
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                    next_cp, next_hb = (next_cp + CHECKPOINT_EVERY_S, next_hb) if due == next_cp else (next_cp, next_hb + HEARTBEAT_EVERY_S)
                latencies.append((time.monotonic() - t0) * 1000)

    async def main() -> None:
        warm, begin, ready, span = asyncio.Semaphore(8), asyncio.Event(), [0], [0.0, 0.0]
        await asyncio.gather(*(agent(rt, run, warm, ready, begin, span) for rt, run in agents))

    asyncio.run(main())
    print("RESULT " + json.dumps({"latencies_ms": latencies, "errors": errors[:20], "error_count": len(errors)}), flush=True)
    return 0


# ---------------------------------------------------------------- one level
def open_agents(url: str, token: str, n: int) -> list[list[int]]:
    """``n`` sessions, each with a live runtime and an open run, through the shipped client."""
    from novelforge_client import AsyncClient

    async def one(c: AsyncClient, sem: asyncio.Semaphore) -> list[int]:
        async with sem:
            s = await c.create_session(role="writer", memory_policy="bounded", task_mode="drafting",
                                       runtime_family="claude-code",
                                       runtime={"runtime_family": "claude-code", "capabilities": ["draft"], "lease_seconds": 60})
            run = await c.start_run(s.id, cursor={"step": "start"})
            return [s.runtime_id, run.id]

    async def main() -> list[list[int]]:
        sem = asyncio.Semaphore(8)
        async with AsyncClient(url, token) as c:
            return list(await asyncio.gather(*(one(c, sem) for _ in range(n))))

    return asyncio.run(main())


def last_event_id(db_url: str, project_id: int) -> int:
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(max(id), 0) FROM novelforge_sessions_event WHERE project_id = %s",
                           (project_id,)).fetchone()
    return int(row[0])


def events_between(db_url: str, project_id: int, low: int) -> int:
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM novelforge_sessions_event WHERE project_id = %s AND id > %s",
                           (project_id, low)).fetchone()
    return int(row[0])


def level(url: str, token: str, project_id: int, db_url: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    from workloads import _subscribers, _subscribers_stop

    started = time.monotonic()
    agents = open_agents(url, token, n)
    subs = _subscribers(url, token, project_id, args.dashboards)
    low = last_event_id(db_url, project_id)
    procs, specs = [], []
    try:
        for k in range(AGENT_PROCESSES):
            spec = Path(args.log_file).with_name(f"fleet-agents-{os.getpid()}-{k}.json")
            specs.append(spec)
            spec.write_text(json.dumps(agents[k::AGENT_PROCESSES]))
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--_agents", url, token, str(spec), str(args.hold)],
                stdout=subprocess.PIPE, stderr=open(args.log_file, "ab"), cwd=str(ROOT), text=True))
        outs = [p.communicate(timeout=args.hold + 120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for spec in specs:
            spec.unlink(missing_ok=True)
        expected = events_between(db_url, project_id, low)
        received, _frames = _subscribers_stop(subs, expected * args.dashboards)
    latencies: list[float] = []
    errors: list[str] = []
    error_count = 0
    for out in outs:
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            raise RuntimeError("an agents' process gave no result")
        r = json.loads(lines[-1][len("RESULT "):])
        latencies += r["latencies_ms"]
        errors += r["errors"]
        error_count += r["error_count"]
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("inf")
    gaps = expected * args.dashboards - received
    held = error_count == 0 and p99 <= P99_LIMIT_MS and gaps == 0 and bool(latencies)
    return {"agents": n, "held": held, "requests": len(latencies), "p50_ms": round(latencies[len(latencies) // 2], 1) if latencies else None,
            "p99_ms": round(p99, 1), "errors": error_count, "error_samples": errors[:5], "events": expected,
            "stream_gaps": gaps, "seconds": round(time.monotonic() - started, 1)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from daphne_server import Daphne
    from users import SERVER_ENV, ours_fixture, setup_django

    setup_django(args.db_url)
    token, _, project_id = ours_fixture("fleet", 0)
    server = Daphne(args.db_url, Path(args.log_file), extra_env=SERVER_ENV, server=args.server)
    levels = []
    try:
        for n in args.ladder:
            log(f"{n} agents for {args.hold:.0f} s, {args.dashboards} dashboards ...")
            result = level(server.url, token, project_id, args.db_url, n, args)
            log(f"  {result}")
            levels.append(result)
            if not result["held"]:
                break
    finally:
        server.stop()
    held = [lv["agents"] for lv in levels if lv["held"]]
    return {"largest_held": max(held) if held else 0, "levels": levels, "hold_s": args.hold, "dashboards": args.dashboards,
            "server": args.server}


# ---------------------------------------------------------------- plug-in
def _database(server_url: str) -> str:
    parts = urlsplit(server_url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + DBNAME, parts.query, ""))


def goals(quick: bool, server_url: str, argv: list[str] | None = None) -> list[dict[str, Any]]:
    """The plug-in's row; ``argv`` adds arguments to ``fleet.py`` (a shorter ladder or hold, to try it)."""
    goal = "fleet: agents held 2 min (checkpoint/5 s, heartbeat/10 s, shipped client) + 50 dashboards"
    target = f"p99 ≤ {P99_LIMIT_MS:.0f} ms, 0 errors, 0 gaps"
    if quick:
        return [{"goal": goal, "measured": "-", "target": target, "met": None, "detail": "full run only"}]
    import psycopg
    from psycopg import sql

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DBNAME)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DBNAME)))
    db_url = _database(server_url)
    log_file = BENCH_DIR / "results" / "fleet.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DATABASE_URL": db_url, "LOG_LEVEL": "WARNING"}
    with open(log_file, "ab") as err:
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env, stdout=err, stderr=err, check=True)
        proc = subprocess.run([sys.executable, __file__, "--db-url", db_url, "--log-file", str(log_file),
                               "--server", os.environ.get("NFBENCH_SERVER", "uvicorn"), *(argv or [])], cwd=ROOT,
                              env={**os.environ, "LOG_LEVEL": "WARNING"}, stdout=subprocess.PIPE, stderr=err, text=True,
                              timeout=3600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"bench/fleet.py gave no result (exit {proc.returncode}); see {log_file}")
    r = json.loads(lines[-1][len("RESULT "):])
    detail = "; ".join(f"{lv['agents']}: p99 {lv['p99_ms']} ms, {lv['errors']} errors, {lv['stream_gaps']} gaps"
                       f"{'' if lv['held'] else ' (not held)'}" for lv in r["levels"])
    return [{"goal": goal, "measured": f"{r['largest_held']} agents", "target": target, "met": None,
             "detail": f"largest N held (informational, {r['server']}); ladder {detail}"}]


def main() -> int:
    if len(sys.argv) == 6 and sys.argv[1] == "--_agents":
        return agents_main(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-url", default=f"postgresql://postgres@127.0.0.1:5432/{DBNAME}",
                        help="a migrated database (the plug-in makes one)")
    parser.add_argument("--hold", type=float, default=120.0)
    parser.add_argument("--ladder", type=lambda s: [int(x) for x in s.split(",")], default=[100, 200, 400, 800, 1600])
    parser.add_argument("--dashboards", type=int, default=50)
    parser.add_argument("--server", choices=["uvicorn", "daphne"], default="uvicorn",
                        help="uvicorn as production serves it (python -m novelforge_sessions.serve), or daphne as make run")
    parser.add_argument("--log-file", default=str(BENCH_DIR / "results" / "fleet.log"))
    args = parser.parse_args()
    print("RESULT " + json.dumps(run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
