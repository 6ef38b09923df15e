#!/usr/bin/env python3
"""Instructions per checkpoint POST, counted by callgrind: an A/B that the machine's noise cannot move.

    bench/.venv/bin/python bench/instructions.py                      # this checkout
    bench/.venv/bin/python bench/instructions.py --against HEAD~1     # and another commit, alternately
    bench/.venv/bin/python bench/instructions.py --requests 800 --repeat 2

On this shared 2-core machine the CPU time of one configuration moves by ±25 % from run to run
(the same commit measured 2.9 to 5.1 ms of server CPU per request within ten minutes), so a
change worth 5 % needs many interleaved rounds to show, and hardware counters are not exposed
to the VM. Valgrind's callgrind counts the instructions the server process executes instead:
the same code, inputs and request count give the same total within ~0.5 %, whatever else the
machine is doing (the spread left is the server's timers, which fire by wall time, and a run
under valgrind takes as long as the machine lets it: 4.69–4.71 M for one commit over five runs).

What it does: daphne serves the project exactly as ``make run`` does (the lean API path,
``DB_POOL_MAX_SIZE=10``) under ``valgrind --tool=callgrind --instr-atstart=no``; 8 keep-alive
clients warm it up (120 POSTs), then instrumentation is switched on (``callgrind_control -i
on``), ``--requests`` checkpoint POSTs are made (8 clients, each on its own open run), and the
count is dumped. It prints million instructions per request (user space; the kernel's share and
the cost of GIL hand-offs between threads are not in it: callgrind runs one thread at a time).
It is a complement to ``make bench`` (which measures time), not a replacement.

``--against REV`` checks REV out in a temporary git worktree and measures it alternately with
this checkout, against the same database (migrated by this checkout: compare commits that share
the schema). Needs ``valgrind`` (``callgrind_control`` comes with it) and ``bench/.venv``
(``make bench-quick`` creates it). Each measurement takes about a minute.
"""
from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

import workloads  # noqa: E402  (bench/workloads.py: the fixture and the request body of the goals table)
from daphne_server import free_port  # noqa: E402

CLIENTS = 8
WARMUP_PER_CLIENT = 15
DEFAULT_DB = "postgresql://postgres@127.0.0.1:5432/nfbench_instructions"


def ensure_database(db_url: str) -> None:
    """Create and migrate the database if it is missing (this checkout's migrations)."""
    import psycopg

    server, _, name = db_url.rpartition("/")
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')
    workloads.setup_django(db_url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def post_all(port: int, run_ids: list[int], token: str, per_client: int) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    failures: list[str] = []

    def client(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            for step in range(per_client):
                body = json.dumps(workloads.checkpoint_body(index, step))
                conn.request("POST", f"/api/v1/runs/{run_ids[index]}/checkpoints", body=body, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
                if resp.status != 201:
                    failures.append(f"{resp.status}: {payload[:200]!r}")
                    return
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"a checkpoint POST failed: {failures[0]}")


def measure(root: Path, db_url: str, requests: int, label: str, out_dir: Path) -> float:
    """Million instructions per checkpoint POST of ``root``'s server."""
    workloads.setup_django(db_url)
    _, token, run_ids = workloads.ours_fixture("instr", CLIENTS)
    from django.db import connection

    connection.close()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DB_CONN_MAX_AGE"}}
    env.update(
        DATABASE_URL=db_url, DJANGO_SETTINGS_MODULE="novelforge_sessions.settings",
        PYTHONPATH=os.pathsep.join([str(root / "bench"), str(root)]), ALLOWED_HOSTS="127.0.0.1,localhost",
        LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1", DB_POOL_MAX_SIZE="10", API_LEAN="true", LIVE_SWEEP_SECONDS="600",
        PYTHONMALLOC="malloc",  # valgrind sees every allocation as it is; the same for both sides
    )
    dump = out_dir / f"{label}.callgrind"
    with open(out_dir / f"{label}.log", "wb") as log:
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={dump}",
             sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "novelforge_sessions.asgi:application"],
            cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start; see {out_dir / (label + '.log')}") from None
                time.sleep(1)
        post_all(port, run_ids, token, WARMUP_PER_CLIENT)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
        per_client = max(1, requests // CLIENTS)
        post_all(port, run_ids, token, per_client)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
    finally:
        proc.terminate()
        proc.wait(120)
    total = 0
    for path in glob.glob(f"{dump}*"):
        with open(path) as fh:
            for line in fh:
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
    if not total:
        raise RuntimeError(f"callgrind counted nothing; see {dump}*")
    return total / (per_client * CLIENTS) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="measured checkpoint POSTs (8 clients)")
    parser.add_argument("--repeat", type=int, default=1, help="measurements of each side")
    parser.add_argument("--against", metavar="REV", help="also measure this git revision, alternately")
    parser.add_argument("--db-url", default=DEFAULT_DB, help="created and migrated when missing")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind (with callgrind_control) is not installed", file=sys.stderr)
        return 2
    ensure_database(args.db_url)
    out_dir = Path(tempfile.mkdtemp(prefix="nf-instructions-"))
    sides = [("this checkout", ROOT)]
    worktree = None
    try:
        if args.against:
            worktree = out_dir / "against"
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(worktree), args.against], cwd=ROOT, check=True)
            sides.append((args.against, worktree))
        results: dict[str, list[float]] = {name: [] for name, _ in sides}
        for turn in range(args.repeat):
            order = sides if turn % 2 == 0 else sides[::-1]
            for name, root in order:
                value = measure(root, args.db_url, args.requests, f"{len(results[name])}-{name.replace(' ', '_').replace('/', '_')}", out_dir)
                results[name].append(value)
                print(f"{name}: {value:.3f} M instructions per request", flush=True)
        if args.against:
            mine, theirs = min(results[sides[0][0]]), min(results[args.against])
            print(f"this checkout / {args.against}: {mine / theirs:.3f}")
    finally:
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    print(f"(callgrind dumps and server logs: {out_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
