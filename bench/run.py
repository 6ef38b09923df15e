#!/usr/bin/env python3
"""The performance goals, measured as users run the systems: ``python bench/run.py [--quick] [--rounds N]``.

Any Python 3.11+ can start it: it creates ``bench/.venv`` (the project installed editable with its
``langgraph`` and ``mcp`` extras, plus ``bench/requirements.txt``), re-executes itself there,
recreates the databases ``<prefix>_ours``, ``<prefix>_dbos`` and ``<prefix>_langgraph``
(``--db-prefix``, default ``nfbench``) on the server named by ``DATABASE_URL`` (default
127.0.0.1:5432, user postgres), runs every workload of ``bench/goals.py`` in its own process
(``bench/users.py``), round after round with the order reversed every other round, prints the
table and writes ``bench/results/<timestamp>.json`` (with the commit measured). ``--classic``
runs the older per-step comparison (``bench/workloads.py``). See bench/README.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
VENV = BENCH_DIR / ".venv"
VENV_PY = VENV / "bin" / "python"
REQUIREMENTS = BENCH_DIR / "requirements.txt"
STAMP = VENV / ".nfbench-installed.sha256"
RESULTS = BENCH_DIR / "results"
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/postgres"
#: --classic: the database of each system, after the --db-prefix (default nfbench_ours, ...).
DATABASES = {"floor": "ours", "ours": "ours", "dbos": "dbos", "langgraph": "langgraph"}
# Bound on one scenario process beyond its own --max-seconds: start-up, warm-up, DBOS's idle
# windows (~14 s) and teardown. A scenario that overruns is killed and reported as an error.
SCENARIO_OVERHEAD_S = 120.0


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- bench/.venv
def wanted_stamp() -> str:
    digest = hashlib.sha256()
    for path in (REQUIREMENTS, ROOT / "pyproject.toml"):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def pip(*args: str) -> bool:
    cmd = [str(VENV_PY), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    log("$ " + " ".join(cmd[2:]))
    return subprocess.run(cmd, cwd=ROOT).returncode == 0


def ensure_venv() -> None:
    """Create/refresh bench/.venv, then re-exec this script with its interpreter."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    if not VENV_PY.exists():
        log(f"creating {VENV.relative_to(ROOT)} with {sys.executable}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    if not STAMP.exists() or STAMP.read_text().strip() != wanted_stamp():
        log("installing the project (editable) and the peers into bench/.venv")
        if pip("-e", f"{ROOT}[langgraph,mcp]", "-r", str(REQUIREMENTS)):
            STAMP.write_text(wanted_stamp() + "\n")
        else:
            # Keep the bench usable without a peer that cannot be installed here: install the
            # project alone, then each peer on its own; a missing peer is reported as skipped.
            log("installing everything at once failed; trying the project and each peer separately")
            if not pip("-e", f"{ROOT}[langgraph,mcp]") and not pip("-e", str(ROOT)):
                sys.exit("[bench] cannot install the project into bench/.venv")
            for line in REQUIREMENTS.read_text().splitlines():
                requirement = line.split("#", 1)[0].strip()
                if requirement and not pip(requirement):
                    log(f"could not install {requirement}; its scenarios will be skipped")
    os.execv(str(VENV_PY), [str(VENV_PY), str(Path(__file__).resolve()), *sys.argv[1:]])


# ---------------------------------------------------------------- PostgreSQL
def server_url() -> str:
    """The server part of DATABASE_URL (its database name is ignored)."""
    url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        sys.exit(f"[bench] DATABASE_URL must be a postgres:// URL, got scheme {parts.scheme!r}")
    # postgresql:// is the spelling every client here accepts (SQLAlchemy, used by DBOS, needs it).
    return urlunsplit(("postgresql", parts.netloc, "/postgres", parts.query, ""))


def database_url(server: str, dbname: str) -> str:
    parts = urlsplit(server)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, ""))


def recreate_databases(server: str, names: list[str]) -> dict[str, Any]:
    import psycopg
    from psycopg import sql

    with psycopg.connect(server, autocommit=True, connect_timeout=5) as conn:
        for name in names:
            try:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            except psycopg.errors.SyntaxError:  # PostgreSQL < 13 has no FORCE
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            log(f"created database {name}")
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('server_version', 'synchronous_commit', 'fsync', 'wal_sync_method', 'shared_buffers', 'max_connections')"
            ).fetchall()
        )
    return settings


# ---------------------------------------------------------------- scenarios
def plan(workers: int, only: set[str]) -> list[tuple[str, str, int]]:
    """(system, scenario, workers) in run order. Sequential first, then ``workers`` concurrent."""
    rows = [
        ("floor", "floor", 1), ("floor", "floor", workers),
        ("ours", "ours_action", 1), ("ours", "ours_action", workers),
        ("ours", "ours_api", 1), ("ours", "ours_api", workers),
        ("ours", "ours_api_tuned", 1), ("ours", "ours_api_tuned", workers),
        ("dbos", "dbos_step_in_workflow", 1), ("dbos", "dbos_step_in_workflow", workers),
        ("dbos", "dbos_workflow_per_step", 1),
        ("langgraph", "langgraph_sync", 1), ("langgraph", "langgraph_sync", workers),
        ("langgraph", "langgraph_async", 1),
    ]
    return [r for r in rows if r[0] in only]


def run_scenario(
    scenario: str, workers: int, *, db_url: str, args: argparse.Namespace, log_file: Path
) -> dict[str, Any]:
    cmd = [
        sys.executable, str(BENCH_DIR / "workloads.py"), "--scenario", scenario, "--db-url", db_url,
        "--steps", str(args.steps), "--workers", str(workers), "--max-seconds", str(args.max_seconds),
        "--log-file", str(log_file),
    ]
    env = {**os.environ, "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with open(log_file, "ab") as err:
        err.write(f"\n===== {scenario} workers={workers}\n".encode())
        err.flush()
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err,
                timeout=args.max_seconds + SCENARIO_OVERHEAD_S,
            )
        except subprocess.TimeoutExpired:
            return {"scenario_id": scenario, "workers": workers, "error": "scenario process timed out and was killed"}
    for line in reversed(proc.stdout.decode(errors="replace").splitlines()):
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            result.setdefault("workers", workers)
            result["process_s"] = round(time.monotonic() - started, 1)
            # The machine is shared: the 1-minute load average around the scenario says how noisy it was.
            result["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            return result
    return {"scenario_id": scenario, "workers": workers, "error": f"no result (exit {proc.returncode}); see {log_file}"}


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """With --rounds > 1: one row per scenario, each metric the median over its rounds."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["system"], r["scenario_id"], r["workers"]), []).append(r)
    rows = []
    for members in groups.values():
        ok = [m for m in members if "steps" in m]
        if not ok:
            rows.append(members[-1])
            continue
        row = {k: v for k, v in ok[0].items() if k not in {"latencies_ms", "round"}}
        for key in ("steps", "elapsed_s", "steps_per_s", "cpu_ms_per_step", "xacts_per_step", "write_xacts_per_step",
                    "rows_written_per_step", "background_xacts_per_s"):
            values = [m[key] for m in ok if m.get(key) is not None]
            if values:
                row[key] = statistics.median(values)
        row["latency_ms"] = {q: statistics.median(m["latency_ms"][q] for m in ok) for q in ok[0]["latency_ms"]}
        row["quiesced"] = all(m.get("quiesced", True) for m in ok)
        row["deadline_hit"] = any(m.get("deadline_hit") for m in ok)
        row["rounds"] = {"ok": len(ok), "steps_per_s": [m["steps_per_s"] for m in ok],
                         "p50_ms": [m["latency_ms"]["p50"] for m in ok], "xacts_per_step": [m["xacts_per_step"] for m in ok]}
        rows.append(row)
    return rows


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Each row against ours (action layer and API) at the same number of workers.

    Every ratio is this row / ours: steps/s below 1 means slower than ours; latency and
    transactions above 1 mean more than ours.
    """
    base = {(r["system"], r["scenario"], r["workers"]): r for r in results if "steps" in r}
    for r in results:
        if "steps" not in r:
            continue
        for label in ("action", "api"):
            ours = base.get(("ours", label, r["workers"]))
            if ours is None or not ours["steps"] or not r["steps"]:
                continue
            r[f"vs_ours_{label}"] = {
                "steps_per_s": ratio(r["steps_per_s"], ours["steps_per_s"]),
                "p50_latency": ratio(r["latency_ms"]["p50"], ours["latency_ms"]["p50"]),
                "p95_latency": ratio(r["latency_ms"]["p95"], ours["latency_ms"]["p95"]),
                "xacts_per_step": ratio(r["xacts_per_step"], ours["xacts_per_step"]),
                "write_xacts_per_step": ratio(r.get("write_xacts_per_step"), ours.get("write_xacts_per_step")),
            }


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(results: list[dict[str, Any]]) -> None:
    header = (
        f"{'system':<10}{'step':<19}{'wk':>3}{'steps':>6}{'steps/s':>9}{'p50 ms':>8}{'p95 ms':>8}{'cpu ms':>7}"
        f"{'xacts/st':>9}{'wr-x/st':>8}{'rows/st':>8}  {'steps/s vs ours act|api':>24}  {'xacts vs ours act|api':>22}"
    )
    print()
    print(header)
    print("-" * len(header))
    for r in results:
        name = r.get("scenario", r.get("scenario_id", "?"))
        if "steps" not in r:
            reason = r.get("skipped") or r.get("error")
            print(f"{r.get('system', r.get('scenario_id', '?')):<10}{name:<19}{r.get('workers', ''):>3}  {'SKIPPED' if 'skipped' in r else 'ERROR'}: {reason}")
            continue
        va, vp = r.get("vs_ours_action", {}), r.get("vs_ours_api", {})
        speed = f"{fmt(va.get('steps_per_s'))}|{fmt(vp.get('steps_per_s'))}"
        xacts = f"{fmt(va.get('xacts_per_step'))}|{fmt(vp.get('xacts_per_step'))}"
        flag = "" if r.get("quiesced", True) and not r.get("deadline_hit") else "  (!)"
        print(
            f"{r['system']:<10}{name:<19}{r['workers']:>3}{r['steps']:>6}{fmt(r['steps_per_s'], '.1f'):>9}"
            f"{fmt(r['latency_ms']['p50']):>8}{fmt(r['latency_ms']['p95']):>8}{fmt(r.get('cpu_ms_per_step')):>7}{fmt(r['xacts_per_step']):>9}"
            f"{fmt(r.get('write_xacts_per_step')):>8}{fmt(r['rows_written_per_step']):>8}  {speed:>24}  {xacts:>22}{flag}"
        )
    print()
    print("cpu ms = CPU time per step of the process running the system (the daphne server for api rows);")
    print("xacts/st = committed+rolled-back transactions per step on the server (pg_stat_database delta);")
    print("wr-x/st = distinct writer xids per step among rows written (lower bound on write transactions);")
    print("ratios are this row / ours at the same worker count (steps/s < 1: slower than ours).")
    print("(!) = the database did not go quiet or the time bound cut the scenario short; see the JSON.")


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("Django", "django-ninja", "psycopg", "daphne", "dbos", "SQLAlchemy", "langgraph",
                 "langgraph-checkpoint", "langgraph-checkpoint-postgres"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description="Durable step: ours vs DBOS vs LangGraph (see bench/README.md)")
    parser.add_argument("--steps", type=int, default=500, help="durable steps per scenario (split across workers)")
    parser.add_argument("--workers", type=int, default=4, help="concurrent workers for the concurrent scenarios")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="time bound on each scenario's measured steps")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole plan; the table shows medians")
    parser.add_argument("--only", default="floor,ours,dbos,langgraph", help="comma-separated systems to run (--classic)")
    parser.add_argument("--quick", action="store_true", help="the goals table, one round of 5 s windows (a few minutes)")
    parser.add_argument("--classic", action="store_true", help="the per-step comparison table (transactions per step)")
    parser.add_argument("--seconds", type=float, default=0.0, help="goals table: the measured window per workload "
                        "(default 10, --quick 5)")
    parser.add_argument("--db-prefix", default="nfbench", help="goals table: databases are <prefix>_ours, _dbos, "
                        "_langgraph (and the plug-ins' <prefix>_stream, <prefix>_scaling_*), dropped and recreated")
    parser.add_argument("--server", choices=["uvicorn", "daphne"], default="uvicorn",
                        help="goals table: our server and the floor's: uvicorn as production serves it "
                             "(python -m novelforge_sessions.serve), or daphne as make run serves it")
    parser.add_argument("--no-plugins", action="store_true", help="goals table: skip bench/stream.py and bench/scaling.py")
    args = parser.parse_args()
    if not args.classic:
        ensure_venv()
        return goals_main(args)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - set(DATABASES)
    if unknown:
        parser.error(f"unknown systems: {sorted(unknown)}")
    if min(args.steps, args.workers, args.rounds) < 1 or args.max_seconds <= 0 or args.steps < args.workers:
        parser.error("steps, workers, rounds and max-seconds must be positive, and steps >= workers")
    ensure_venv()

    started = datetime.now(timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(parents=True, exist_ok=True)
    log_file = RESULTS / f"{stamp}.log"
    server = server_url()
    names = sorted({f"{args.db_prefix}_{DATABASES[s]}" for s in only})
    pg_settings = recreate_databases(server, names)
    urls = {s: database_url(server, f"{args.db_prefix}_{DATABASES[s]}") for s in DATABASES}

    if only & {"ours"}:
        log(f"migrating {args.db_prefix}_ours")
        env = {**os.environ, "DATABASE_URL": urls["ours"], "LOG_LEVEL": "WARNING"}
        with open(log_file, "ab") as err:
            subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env, stdout=err, stderr=err, check=True)

    runs: list[dict[str, Any]] = []
    for round_no in range(1, args.rounds + 1):
        # Alternate the order between rounds so a burst of load on this shared machine does not
        # always land on the same system.
        order = plan(args.workers, only)
        for system, scenario, workers in (order if round_no % 2 else order[::-1]):
            log(f"round {round_no}/{args.rounds}: {scenario} x{workers} ...")
            result = run_scenario(scenario, workers, db_url=urls[system], args=args, log_file=log_file)
            result.setdefault("system", system)
            result["round"] = round_no
            runs.append(result)
            if "steps" in result:
                log(f"  {result['steps']} steps, {result['steps_per_s']}/s, p50 {result['latency_ms']['p50']} ms, "
                    f"{result['xacts_per_step']} xacts/step ({result['process_s']} s)")
            else:
                log(f"  {result.get('skipped') or result.get('error')}")
    results = aggregate(runs) if args.rounds > 1 else runs
    add_ratios(results)
    finished = datetime.now(timezone.utc)
    report = {
        "git": git_state(),
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": finished.isoformat(timespec="seconds"),
        "args": {"steps": args.steps, "workers": args.workers, "rounds": args.rounds, "max_seconds": args.max_seconds,
                 "only": sorted(only)},
        "environment": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "postgres": pg_settings,
            "server": urlsplit(server).hostname + ":" + str(urlsplit(server).port or 5432),
            "versions": versions(),
        },
        "results": results,
        "runs": runs if args.rounds > 1 else "same as results (one round)",
    }
    out = RESULTS / f"{stamp}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print_table(results)
    print(f"\nraw numbers: {out.relative_to(ROOT)}   (child logs: {log_file.relative_to(ROOT)})")
    print(f"total {(finished - started).total_seconds():.0f} s")
    return 0 if all("error" not in r for r in runs) else 1


def run_goal_scenario(name: str, argv: list[str], *, db_url: str, log_file: Path, timeout: float,
                      script: str = "workloads.py", server: str | None = None) -> dict[str, Any]:
    cmd = [sys.executable, str(BENCH_DIR / script), *argv, "--db-url", db_url, "--log-file", str(log_file)]
    if server is not None:
        cmd += ["--server", server]
    env = {**os.environ, "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    with open(log_file, "ab") as err:
        err.write(f"\n===== {name}: {' '.join(argv)}\n".encode())
        err.flush()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": "scenario process timed out and was killed"}
    for line in reversed(proc.stdout.decode(errors="replace").splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": f"no result (exit {proc.returncode}); see {log_file}"}


def git_state() -> dict[str, Any]:
    """The commit this run measured, and whether the work tree had changes to tracked files."""
    def git(*argv: str) -> str:
        out = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    return {"commit": git("rev-parse", "HEAD") or "unknown",
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def goals_main(args: argparse.Namespace) -> int:
    """The goals table (bench/goals.py): user workloads interleaved round after round, then the
    write counts, the sustained run and the plug-ins; every goal, measured, target, met/missed."""
    sys.path.insert(0, str(BENCH_DIR))
    import goals

    rounds_n = 1 if args.quick and args.rounds == 1 else max(args.rounds, 1 if args.quick else 3)
    started = datetime.now(timezone.utc)
    git = git_state()  # what is measured: the tree as it is when the run starts
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(parents=True, exist_ok=True)
    log_file = RESULTS / f"{stamp}.log"
    server = server_url()
    names = {system: f"{args.db_prefix}_{system}" for system in ("ours", "dbos", "langgraph")}
    pg_settings = recreate_databases(server, sorted(names.values()))
    urls = {s: database_url(server, n) for s, n in names.items()}
    log(f"migrating {names['ours']}")
    env = {**os.environ, "DATABASE_URL": urls["ours"], "LOG_LEVEL": "WARNING"}
    with open(log_file, "ab") as err:
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env, stdout=err, stderr=err, check=True)
    plan = goals.scenarios(args.quick)
    if args.seconds:
        plan = {name: [*argv[:-1], str(args.seconds)] for name, argv in plan.items()}
    rounds: list[dict[str, dict[str, Any]]] = []
    errors: list[str] = []
    timeout = max(float(argv[-1]) for argv in plan.values()) + SCENARIO_OVERHEAD_S + 180
    for round_no in range(1, rounds_n + 1):
        names_order = list(plan) if round_no % 2 else list(plan)[::-1]  # interleaved: the order alternates
        results: dict[str, dict[str, Any]] = {}
        for name in names_order:
            log(f"round {round_no}/{rounds_n}: {name} ...")
            db = urls[goals.DATABASE_OF.get(name, "ours")]
            result = run_goal_scenario(name, plan[name], db_url=db, log_file=log_file, timeout=timeout, script="users.py",
                                       server=args.server)
            if "error" in result or "skipped" in result:
                errors.append(f"{name} (round {round_no}): {result.get('error') or result.get('skipped')}")
                log(f"  {errors[-1]}")
            else:
                results[name] = result
                log(f"  {result['steps']} steps, {result['steps_per_s']}/s, machine {result['machine_cpu_ms_per_step']} ms/step "
                    f"({result['machine_busy_cores']} cores busy), server {result['server_cpu_ms_per_step']} ms/step")
        rounds.append(results)
    counted: dict[str, dict[str, Any]] = {}
    for name, argv in goals.counts(args.quick).items():
        log(f"{name}: counting on the server ...")
        counted[name] = run_goal_scenario(name, argv, db_url=urls["ours"], log_file=log_file, timeout=300, script="users.py",
                                          server=args.server)
        if "error" in counted[name] or "skipped" in counted[name]:
            errors.append(f"{name}: {counted[name].get('error') or counted[name].get('skipped')}")
    log("soak: sustained load with websockets and pages (RSS drift) ...")
    drift = [run_goal_scenario("sustained", goals.sustained(args.quick), db_url=urls["ours"], log_file=log_file,
                               timeout=900, server=args.server)]
    if "error" in drift[0]:
        errors.append(f"sustained: {drift[0]['error']}")
    plugins: list[dict[str, Any]] = []
    if not args.no_plugins:
        log("plug-in modules ...")
        os.environ["NFBENCH_DB_PREFIX"] = args.db_prefix
        os.environ["NFBENCH_SERVER"] = args.server  # the fleet's server: the goals table's
        plugins = goals.plugin_rows(args.quick, server)
    rows = goals.summarise(rounds, [d for d in drift if "error" not in d], plugins, counted["p2"], counted["p3"])
    workloads = goals.workload_rows(rounds)
    finished = datetime.now(timezone.utc)
    out = RESULTS / f"{stamp}.json"
    goals.dump(out, {
        "started_at": started.isoformat(timespec="seconds"), "finished_at": finished.isoformat(timespec="seconds"),
        "git": {**git, "changed_during_run": git_state() != git}, "mode": "quick" if args.quick else "full",
        "rounds": rounds_n, "server": args.server,
        "method": "steps/s of whole workloads (8 client processes), whole-machine CPU per step from /proc/stat; "
                  "goals are medians of per-round steps/s ratios",
        "workloads": workloads, "goals": rows, "errors": errors,
        "environment": {"cpus": os.cpu_count(), "platform": platform.platform(), "postgres": pg_settings,
                        "versions": versions(), "loadavg": os.getloadavg(), "databases": names},
        "scenarios": {name: argv for name, argv in plan.items()}, "per_round": rounds, "counts": counted,
        "sustained": drift,
    })
    print(f"\ncommit {git['commit'][:12]}{' (dirty tree)' if git['dirty'] else ''}, {rounds_n} round(s), {args.server}, "
          f"{plan[next(iter(plan))][-1]} s windows, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end")
    goals.print_workloads(workloads)
    goals.print_table(rows)
    for e in errors:
        print(f"ERROR {e}")
    print(f"\nraw numbers: {out.relative_to(ROOT)}   (logs: {log_file.relative_to(ROOT)})")
    print(f"total {(finished - started).total_seconds():.0f} s")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
