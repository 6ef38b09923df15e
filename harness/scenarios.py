"""The faults: kill points (on handoffs, deliveries and heartbeats, and on the checkpoint write
path), PostgreSQL restarts and terminated backends, a Redis restart under two servers with open
websockets, and a bounded load. Each returns one dict of figures."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg

from harness import checks
from harness.agents import Agent, History, percentile
from harness.infra import ROOT, Daphne, Infra

KILL_PATHS = r"/handoffs$|/results$|/heartbeat$"
#: The checkpoint write path: the single checkpoint (the batch takes no idempotency key, so a
#: retry after a lost answer could write twice: it is not killed here).
CHECKPOINT_PATHS = r"/checkpoints$"


class Deployment:
    """One database on the throwaway cluster, migrated, with a project and a token."""

    def __init__(self, infra: Infra, name: str) -> None:
        self.infra = infra
        self.db = "nf_harness"
        self.url = infra.pg.url(self.db)
        if name not in getattr(infra, "projects", {}):
            prepare(infra, [name])
        info = infra.projects[name]  # type: ignore[attr-defined]
        self.token, self.project_id, self.tables = info["token"], info["project_id"], info["tables"]

    def env(self, **extra: str) -> dict[str, str]:
        return self.infra.server_env(self.url, **extra)

    def verdict(self, history: History) -> dict[str, Any]:
        return checks.verdict(history, checks.effects(self.url, self.tables, self.project_id))


def prepare(infra: Infra, names: list[str]) -> None:
    """One database, migrated once, and one project (with a token) per fault, all in one
    Django process (a start-up costs seconds on a loaded machine)."""
    url = infra.pg.url("nf_harness")
    args = [n for n in names if n not in getattr(infra, "projects", {})]
    if not hasattr(infra, "projects"):
        with psycopg.connect(infra.pg.url("postgres"), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "nf_harness"')
        infra.projects = {}  # type: ignore[attr-defined]
        args = ["--migrate", *args]
    out = subprocess.run([sys.executable, "-m", "harness.setup_db", *args], cwd=ROOT, env=infra.server_env(url),
                         capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise RuntimeError(f"harness setup failed: {out.stderr[-2000:]}")
    infra.projects.update(json.loads(out.stdout.strip().splitlines()[-1]))  # type: ignore[attr-defined]


def _run_agents(n: int, target: Any) -> tuple[list[threading.Thread], list[BaseException]]:
    errors: list[BaseException] = []

    def wrap(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 — reported in the figures
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads, errors


def _first_ok_after(history: History, t: float) -> float | None:
    oks = [o.ended for o in history.ops if o.outcome == "ok" and o.started >= t]
    return min(oks) - t if oks else None


# ---- kill points -----------------------------------------------------------------------------------
def _kill_and_restart(server: Daphne, fault_env: dict[str, str], *, rounds: int, errors: list[BaseException],
                      seconds: float = 120.0) -> tuple[list[float], list[float]]:
    """Wait for the hook to kill ``server``, start it again (armed again, but the last time),
    ``rounds`` times or until ``seconds`` passed or an agent failed: (kill times, restart seconds)."""
    kills: list[float] = []
    restarts: list[float] = []
    deadline = time.monotonic() + seconds
    while len(kills) < rounds and time.monotonic() < deadline and not errors:
        assert server.proc is not None
        try:
            server.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            continue
        kills.append(time.monotonic())
        last = len(kills) == rounds
        restarts.append(server.start(None if last else fault_env))
    return kills, restarts


def _killed_by_hook(server: Daphne, point: str) -> int:
    return sum(1 for line in server.log_path.read_text(errors="replace").splitlines()
               if line.startswith(f"fault point {point}"))


def kill_point(infra: Infra, point: str, *, rounds: int, agents: int, every: int = 3) -> dict[str, Any]:
    """SIGKILL at ``point`` of a runtime heartbeat, handoff or delivery commit, ``rounds`` times;
    after each kill the harness starts the server again. Agents retry every step with the same
    logical id."""
    dep = Deployment(infra, f"kill_{point}")
    fault_env = {"NOVELFORGE_FAULT_POINTS": f"{point}:{every}:{KILL_PATHS}"}
    server = infra.daphne(dep.env(), f"kill-{point}")
    server.start(fault_env)  # the sessions and runs below do not commit on KILL_PATHS
    history, stop = History(), threading.Event()
    clients = [Agent(f"{point}-a{i}", server.url, dep.token, history, stop) for i in range(agents)]
    opened = [c.open_session() for c in clients]

    def agent(i: int) -> None:
        n = 0
        _, runtime, run = opened[i]
        while not stop.is_set():
            clients[i].heartbeat(runtime)
            clients[i].job(run, f"{point}/a{i}/job{n}")
            n += 1

    threads, errors = _run_agents(agents, agent)
    kills, restarts = _kill_and_restart(server, fault_env, rounds=rounds, errors=errors)
    time.sleep(0.5)  # a little traffic on the healthy server, then everyone finishes its job
    stop.set()
    for t in threads:
        t.join(timeout=90)
    for c in clients:
        c.close()
    recovery = [r for r in (_first_ok_after(history, k) for k in kills) if r is not None]
    killed_by_hook = _killed_by_hook(server, point)
    server.stop()
    result = dep.verdict(history)
    result.update(
        fault=f"kill {point}", rounds=len(kills), killed_by_hook=killed_by_hook,
        restart_max_s=round(max(restarts, default=0), 2), recovery_max_s=round(max(recovery, default=0), 2),
        errors=[repr(e)[:300] for e in errors], server_5xx=len(history.server_errors()),
    )
    result["ok"] = (result["rounds"] == rounds and killed_by_hook == rounds and not errors
                    and result["duplicates"] == 0 and result["lost"] == 0 and result["acknowledged"] > 0)
    return result


# ---- kill points on the checkpoint write path -------------------------------------------------------
def checkpoint_kill(infra: Infra, point: str, *, rounds: int, agents: int, every: int = 3,
                    seconds: float = 60.0) -> dict[str, Any]:
    """SIGKILL at ``point`` of a checkpoint write, ``rounds`` times (every ``every``-th commit on
    ``CHECKPOINT_PATHS``), the server started again after each. Agents write through the shipped
    typed client (``novelforge_client.Client.checkpoint``), one idempotency key per logical step;
    the client retries a step with its key until it is acknowledged (a refused connection while
    the server is down, an answer lost with the process). Then, from the database: every
    acknowledged checkpoint is there with the body sent (0 lost), one row per key (0
    duplicates), and each run's seqs are 1..n with n its checkpoint count (0 gaps)."""
    from novelforge_client import Client, RetryPolicy, TransportError

    dep = Deployment(infra, f"checkpoint_{point}")
    fault_env = {"NOVELFORGE_FAULT_POINTS": f"{point}:{every}:{CHECKPOINT_PATHS}"}
    server = infra.daphne(dep.env(), f"checkpoint-{point}")
    server.start(fault_env)  # the sessions and runs below do not commit on CHECKPOINT_PATHS
    history, stop = History(), threading.Event()
    setup = [Agent(f"cp-{point}-a{i}", server.url, dep.token, history, stop) for i in range(agents)]
    runs = [c.open_session()[2] for c in setup]
    for c in setup:
        c.close()
    # Retries spaced 0.05 s doubling to 0.5 s, for about two minutes: past any restart.
    retry = RetryPolicy(attempts=250, backoff=0.05, max_backoff=0.5)
    clients = [Client(server.url, dep.token, timeout=30.0, retry=retry) for _ in range(agents)]
    acked: dict[str, tuple[int, int, int, dict[str, Any], float]] = {}  # key → (run, id, seq, cursor, acked at)
    sent: dict[str, int] = {}  # key → run: every step begun, acknowledged or not
    lock = threading.Lock()

    def agent(i: int) -> None:
        n = 0
        while not stop.is_set():
            key = f"{point}/a{i}/step{n}"
            cursor = {"agent": i, "step": n, "key": key}
            with lock:
                sent[key] = runs[i]
            deadline = time.monotonic() + 120
            while True:  # the client retries within a call; a call that gives up is repeated, same key
                try:
                    out = clients[i].checkpoint(runs[i], boundary="context_freeze", cursor=cursor, idempotency_key=key)
                    break
                except TransportError:
                    if time.monotonic() > deadline:
                        raise
            with lock:
                acked[key] = (runs[i], out.id, out.seq, cursor, time.monotonic())
            n += 1

    threads, errors = _run_agents(agents, agent)
    kills, restarts = _kill_and_restart(server, fault_env, rounds=rounds, errors=errors, seconds=seconds)
    time.sleep(0.5)  # a little traffic on the healthy server, then every agent finishes its step
    stop.set()
    for t in threads:
        t.join(timeout=150)
    for c in clients:
        c.close_client()
    killed_by_hook = _killed_by_hook(server, point)
    server.stop()

    cp, run_table = dep.tables["Checkpoint"], dep.tables["Run"]
    with psycopg.connect(dep.url, autocommit=True) as conn:
        rows = conn.execute(f"SELECT id, run_id, seq, idempotency_key, cursor FROM {cp} WHERE run_id = ANY(%s)",
                            [runs]).fetchall()
        counts = dict(conn.execute(f"SELECT id, checkpoint_count FROM {run_table} WHERE id = ANY(%s)", [runs]).fetchall())
    by_id = {r[0]: r for r in rows}
    per_key: dict[str | None, int] = {}
    for r in rows:
        per_key[r[3]] = per_key.get(r[3], 0) + 1
    duplicates = sorted(str(k) for k, n in per_key.items() if n > 1 or k is None)
    lost = sorted(k for k, (run, cid, seq, cursor, _) in acked.items()
                  if cid not in by_id or by_id[cid][1:] != (run, seq, k, cursor))
    gaps = []
    for run in runs:
        seqs = sorted(r[2] for r in rows if r[1] == run)
        if seqs != list(range(1, len(seqs) + 1)) or counts.get(run) != len(seqs):
            gaps.append(run)
    unacked_written = sum(1 for k in sent if k not in acked and per_key.get(k))
    recovery = [min((t for *_, t in acked.values() if t >= k), default=k) - k for k in kills]
    result = {
        "fault": f"kill checkpoint {point}", "rounds": len(kills), "killed_by_hook": killed_by_hook,
        "acknowledged": len(acked), "rows": len(rows), "duplicates": len(duplicates), "lost": len(lost),
        "seq_gaps": len(gaps), "duplicate_ids": duplicates[:10], "lost_ids": lost[:10], "gap_runs": gaps[:10],
        "steps_unacknowledged": len(sent) - len(acked), "steps_unacknowledged_written": unacked_written,
        "restart_max_s": round(max(restarts, default=0), 2), "recovery_max_s": round(max(recovery, default=0), 2),
        "errors": [repr(e)[:300] for e in errors],
    }
    result["ok"] = (result["rounds"] == rounds and killed_by_hook == rounds and not errors and not duplicates
                    and not lost and not gaps and result["acknowledged"] > 0)
    return result


# ---- PostgreSQL restarts and terminated backends ---------------------------------------------------
def postgres_faults(infra: Infra, *, rounds: int, agents: int, gap: float = 1.0) -> dict[str, Any]:
    """Under load, ``rounds`` fast restarts of the cluster, then ``rounds`` times every backend of
    the app's database terminated. The server is never restarted by the harness."""
    dep = Deployment(infra, "postgres")
    server = infra.daphne(dep.env(), "postgres")
    server.start()
    pid = server.pid
    history, stop = History(), threading.Event()
    clients = [Agent(f"pg-a{i}", server.url, dep.token, history, stop) for i in range(agents)]
    runs = [c.open_session()[2] for c in clients]

    def agent(i: int) -> None:
        n = 0
        while not stop.is_set():
            clients[i].job(runs[i], f"pg/a{i}/job{n}")
            n += 1

    threads, errors = _run_agents(agents, agent)
    probe = Agent("pg-probe", server.url, dep.token, History(), stop)
    faults: list[tuple[str, float, float]] = []  # kind, injected at, recovered after

    def recovered_after(t0: float) -> float:
        while time.monotonic() - t0 < 60:
            outcome, _, _ = probe.call("GET", "/sessions?limit=1", op="probe", key="")
            if outcome == "ok":
                return time.monotonic() - t0
            time.sleep(0.02)
        return float("inf")

    for kind in ("restart", "terminate"):
        for _ in range(rounds):
            time.sleep(gap)
            t0 = time.monotonic()
            if kind == "restart":
                infra.pg.restart()
            else:
                with psycopg.connect(infra.pg.url("postgres"), autocommit=True) as conn:
                    conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE datname = %s AND pid <> pg_backend_pid()", [dep.db])
            faults.append((kind, t0, recovered_after(t0)))
    time.sleep(gap)
    stop.set()
    for t in threads:
        t.join(timeout=90)
    for c in [*clients, probe]:
        c.close()
    same_process = server.alive() and server.pid == pid and server.starts == 1
    server.stop()
    result = dep.verdict(history)
    statuses: dict[str, int] = {}
    for o in history.ops:
        if o.outcome == "fail" and o.http:
            statuses[f"{o.http} {o.code}"] = statuses.get(f"{o.http} {o.code}", 0) + 1
    by_kind = {k: max((r for kk, _, r in faults if kk == k), default=0) for k in ("restart", "terminate")}
    result.update(
        fault="postgres restart + pg_terminate_backend", rounds=len(faults),
        recovery_max_s=round(max(by_kind.values()), 2),
        recovery_restart_max_s=round(by_kind["restart"], 2), recovery_terminate_max_s=round(by_kind["terminate"], 2),
        server_restarted=not same_process, refusals=statuses, server_500=sum(1 for o in history.ops if o.http == 500),
        errors=[repr(e)[:300] for e in errors],
    )
    result["ok"] = (same_process and not errors and result["duplicates"] == 0 and result["lost"] == 0
                    and result["server_500"] == 0 and result["recovery_max_s"] < 60 and result["acknowledged"] > 0)
    return result


# ---- Redis restart with two servers and open websockets --------------------------------------------
def redis_restart(infra: Infra, *, rounds: int, sockets: int, gap: float = 1.0) -> dict[str, Any]:
    from websockets.exceptions import ConnectionClosed, InvalidHandshake
    from websockets.sync.client import connect

    assert infra.redis is not None
    dep = Deployment(infra, "redis")
    env = dep.env(REDIS_URL=infra.redis.url, LIVE_SWEEP_SECONDS="1")
    servers = [infra.daphne(env, "redis-a"), infra.daphne(env, "redis-b")]
    for s in servers:
        s.start()
    history, stop = History(), threading.Event()
    writers = [Agent(f"redis-w{i}", s.url, dep.token, history, stop) for i, s in enumerate(servers)]
    sessions = [w.open_session()[0] for w in writers]
    with psycopg.connect(dep.url, autocommit=True) as conn:
        start_cursor = conn.execute(f"SELECT coalesce(max(id), 0) FROM {dep.tables['Event']} WHERE project_id = %s",
                                    [dep.project_id]).fetchone()[0]

    received: list[list[int]] = [[] for _ in range(sockets)]
    reconnects = [0] * sockets
    resumes = [0] * sockets
    epoch = [0]  # bumped at each Redis restart: the odd sockets then drop and resume from their cursor
    done = threading.Event()

    def reader(i: int) -> None:
        server = servers[i % 2]
        cursor = start_cursor
        seen_epoch = 0
        while not done.is_set():
            try:
                with connect(server.ws_url + "/ws/events/", origin=server.url, open_timeout=5,
                             additional_headers={"Authorization": f"Bearer {dep.token}"}) as ws:
                    ws.send(json.dumps({"type": "subscribe", "project_id": dep.project_id, "after": cursor}))
                    while not done.is_set():
                        if i % 2 and seen_epoch != epoch[0]:
                            seen_epoch = epoch[0]
                            resumes[i] += 1
                            break  # a client that lost its socket: reconnect, resume after its cursor
                        try:
                            frame = json.loads(ws.recv(timeout=0.2))
                        except TimeoutError:
                            continue
                        if frame.get("type") == "event":
                            received[i].append(frame["event"]["id"])
                            cursor = max(cursor, frame["event"]["id"])
            except (ConnectionClosed, InvalidHandshake, OSError):
                reconnects[i] += 1
                time.sleep(0.1)

    readers = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(sockets)]
    for t in readers:
        t.start()
    time.sleep(gap)
    writing = threading.Event()

    def writer(k: int) -> None:
        w, sid = writers[k], sessions[k]
        n = 0
        while not writing.is_set():
            w.until_ok("POST", f"/sessions/{sid}/transcript", {"role": "user", "content": f"entry {n}"},
                       op="transcript", key=f"{sid}:{n}")
            n += 1

    wthreads, errors = _run_agents(len(writers), writer)
    restarts = []
    for _ in range(rounds):
        time.sleep(gap)
        t0 = time.monotonic()
        infra.redis.restart()
        restarts.append(time.monotonic() - t0)
        epoch[0] += 1
    time.sleep(gap)
    writing.set()
    for t in wthreads:
        t.join(timeout=60)
    with psycopg.connect(dep.url, autocommit=True) as conn:
        expected = [r[0] for r in conn.execute(
            f"SELECT id FROM {dep.tables['Event']} WHERE project_id = %s AND id > %s ORDER BY id",
            [dep.project_id, start_cursor]).fetchall()]
    # Every socket must reach the last event (the resume path: cursor, then replay).
    last = expected[-1] if expected else 0
    t_end = time.monotonic()
    while time.monotonic() - t_end < 30 and any((r[-1] if r else 0) < last for r in received):
        time.sleep(0.05)
    catch_up = time.monotonic() - t_end
    done.set()
    for t in readers:
        t.join(timeout=10)
    for w in writers:
        w.close()
    exp = set(expected)
    gaps = sum(len(exp - set(r)) for r in received)
    dups = sum(len(r) - len(set(r)) for r in received)
    out_of_order = sum(1 for r in received if r != sorted(r))
    alive = all(s.alive() for s in servers)
    for s in servers:
        s.stop()
    result = {
        "fault": "redis restart (2 servers, open websockets)", "rounds": rounds, "sockets": sockets,
        "events": len(expected), "acknowledged": len(history.acked("transcript")),
        "delivered": sum(len(r) for r in received), "gaps": gaps, "duplicates": dups, "lost": gaps,
        "out_of_order": out_of_order, "resumes": sum(resumes), "reconnects_after_close": sum(reconnects),
        "catch_up_s": round(catch_up, 2), "errors": [repr(e)[:300] for e in errors],
        "recovery_max_s": round(max(restarts, default=0) + catch_up, 2), "servers_alive": alive,
        "server_5xx": len(history.server_errors()),
    }
    result["ok"] = (gaps == 0 and dups == 0 and out_of_order == 0 and alive and len(expected) > 0 and not errors
                    and result["server_5xx"] == 0)
    return result


# ---- load ------------------------------------------------------------------------------------------
def load(infra: Infra, *, agents: int, seconds: float) -> dict[str, Any]:
    """``agents`` agents, each cycling create → attach → run → checkpoints → handoff → claim →
    deliver, with a duplicate delivery every cycle and a conflicting one every fifth."""
    dep = Deployment(infra, "load")
    server = infra.daphne(dep.env(), "load")
    server.start()
    history, stop = History(), threading.Event()
    clients = [Agent(f"load-a{i}", server.url, dep.token, history, stop, retry_for=30) for i in range(agents)]
    cycles = [0] * agents
    peak = [0]

    def watch_connections() -> None:
        with psycopg.connect(infra.pg.url("postgres"), autocommit=True) as conn:
            while not stop.is_set():
                n = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [dep.db]).fetchone()[0]
                peak[0] = max(peak[0], n)
                time.sleep(0.1)

    def agent(i: int) -> None:
        c = clients[i]
        while not stop.is_set():
            k = cycles[i]
            _, _, run = c.open_session(attach_separately=True)
            for step in (1, 2):
                c.checkpoint(run, step)
            h = c.handoff(run, f"load/a{i}/c{k}")
            token = c.claim(h)
            c.deliver(h, token, f"r{k}")
            c.deliver(h, token, f"r{k}", op="deliver_duplicate")  # already_consumed, 200
            if k % 5 == 4:
                c.deliver(h, token, f"other {k}", op="deliver_conflict", accept=("conflicting_result",))
            cycles[i] += 1

    rss_start = server.rss_kb()
    watcher = threading.Thread(target=watch_connections, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    threads, errors = _run_agents(agents, agent)
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    elapsed = time.monotonic() - t0
    watcher.join(timeout=5)
    rss_end = server.rss_kb()
    for c in clients:
        c.close()
    server.stop()
    lat = [x for c in clients for x in c.latencies]
    statuses: dict[str, int] = {}
    for o in history.ops:
        statuses[str(o.http or o.outcome)] = statuses.get(str(o.http or o.outcome), 0) + 1
    verdict = dep.verdict(history)
    result = {
        "fault": "load", "agents": agents, "seconds": round(elapsed, 1), "cycles": sum(cycles),
        "requests": len(history.ops), "throughput_rps": round(len(history.ops) / elapsed, 1),
        "p50_ms": round(percentile(lat, 50) * 1000, 1), "p95_ms": round(percentile(lat, 95) * 1000, 1),
        "p99_ms": round(percentile(lat, 99) * 1000, 1), "server_5xx": len(history.server_errors()),
        "statuses": statuses, "peak_db_connections": peak[0], "pool_max": int(dep.env()["DB_POOL_MAX_SIZE"]),
        "rss_start_mb": round(rss_start / 1024, 1), "rss_end_mb": round(rss_end / 1024, 1),
        "duplicates": verdict["duplicates"], "lost": verdict["lost"], "acknowledged": verdict["acknowledged"],
        "errors": [repr(e)[:300] for e in errors],
    }
    result["ok"] = (result["server_5xx"] == 0 and not errors and verdict["duplicates"] == 0 and verdict["lost"] == 0
                    and result["cycles"] > 0)
    return result
