"""``python -m harness`` (``make harness``): every fault (kill points on the handoff, delivery and
heartbeat commits, and on the checkpoint write path), then the load, then the model-based test;
prints the figures and exits non-zero unless every count that must be 0 is 0.

Loopback only, bounded in time: a throwaway PostgreSQL cluster and redis-server on free ports in
a temporary folder (never the machine's 5432/6379), daphne processes started and killed here.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import scenarios
from harness.infra import ROOT, Infra

PROFILES = {
    # rounds per fault, concurrent agents, load seconds, websockets, model-based examples, seconds between faults
    "full": {"rounds": 3, "agents": 6, "load_seconds": 30.0, "sockets": 6, "model_examples": 40, "gap": 1.0},
    "quick": {"rounds": 1, "agents": 2, "load_seconds": 2.0, "sockets": 2, "model_examples": 0, "gap": 0.3},
}
ALL = ("kill", "checkpoint", "postgres", "redis", "load", "model")


def _table(results: list[dict[str, Any]]) -> str:
    head = f"{'fault':44} {'rounds':>6} {'acked':>6} {'dup':>4} {'lost':>4} {'gaps':>4} {'recovery max':>12}  ok"
    lines = [head, "-" * len(head)]
    for r in results:
        if r["fault"] in ("load", "model-based test"):
            continue
        lines.append(f"{r['fault']:44} {r.get('rounds', 0):>6} {r.get('acknowledged', 0):>6} {r.get('duplicates', 0):>4} "
                     f"{r.get('lost', 0):>4} {r.get('seq_gaps', '-'):>4} {r.get('recovery_max_s', 0):>10.2f} s  "
                     f"{'yes' if r['ok'] else 'NO'}")
    for r in results:
        if r["fault"] == "load":
            lines.append(
                f"load: {r['agents']} agents × {r['seconds']} s: {r['cycles']} cycles, {r['requests']} requests, "
                f"{r['throughput_rps']} req/s, p50 {r['p50_ms']} ms, p95 {r['p95_ms']} ms, p99 {r['p99_ms']} ms, "
                f"5xx {r['server_5xx']}, peak DB connections {r['peak_db_connections']} (pool {r['pool_max']}), "
                f"RSS {r['rss_start_mb']} → {r['rss_end_mb']} MB, dup {r['duplicates']}, lost {r['lost']}  "
                f"{'yes' if r['ok'] else 'NO'}")
        if r["fault"] == "model-based test":
            lines.append(f"model-based test: {r['examples']} examples: {'passed' if r['ok'] else 'FAILED'}")
    return "\n".join(lines)


def _model(examples: int, database_url: str) -> dict[str, Any]:
    """The model-based test (tests/harness/test_model.py) with more examples, its test database
    on the throwaway cluster."""
    env = {**os.environ, "NF_MODEL_EXAMPLES": str(examples), "DATABASE_URL": database_url}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "tests/harness/test_model.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    return {"fault": "model-based test", "examples": examples, "ok": proc.returncode == 0,
            "seconds": round(time.monotonic() - t0, 1), "tail": proc.stdout[-800:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--only", default=",".join(ALL), help=f"comma-separated subset of {','.join(ALL)}")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--agents", type=int)
    parser.add_argument("--load-seconds", type=float)
    parser.add_argument("--model-examples", type=int)
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (server logs)")
    args = parser.parse_args(argv)
    cfg = dict(PROFILES[args.profile])
    for key in ("rounds", "agents", "load_seconds", "model_examples"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    only = [x for x in args.only.split(",") if x]
    unknown = set(only) - set(ALL)
    if unknown:
        parser.error(f"unknown part(s): {', '.join(sorted(unknown))}")

    results: list[dict[str, Any]] = []
    t0 = time.monotonic()
    infra = Infra(redis="redis" in only)
    print(f"harness: PostgreSQL on 127.0.0.1:{infra.pg.port}"
          + (f", Redis on 127.0.0.1:{infra.redis.port}" if infra.redis else "") + f" ({infra.base})", flush=True)
    try:
        scenarios.prepare(infra, [name for part, names in (
            ("kill", ["kill_before_commit", "kill_after_commit"]),
            ("checkpoint", ["checkpoint_before_commit", "checkpoint_after_commit"]), ("postgres", ["postgres"]), ("redis", ["redis"]),
            ("load", ["load"])) if part in only for name in names])
        if "kill" in only:
            for point in ("before_commit", "after_commit"):
                results.append(scenarios.kill_point(infra, point, rounds=cfg["rounds"], agents=cfg["agents"]))
                print(json.dumps(results[-1]), flush=True)
        if "checkpoint" in only:
            for point in ("before_commit", "after_commit"):
                results.append(scenarios.checkpoint_kill(infra, point, rounds=cfg["rounds"], agents=cfg["agents"]))
                print(json.dumps(results[-1]), flush=True)
        if "postgres" in only:
            results.append(scenarios.postgres_faults(infra, rounds=cfg["rounds"], agents=cfg["agents"], gap=cfg["gap"]))
            print(json.dumps(results[-1]), flush=True)
        if "redis" in only:
            results.append(scenarios.redis_restart(infra, rounds=cfg["rounds"], sockets=cfg["sockets"], gap=cfg["gap"]))
            print(json.dumps(results[-1]), flush=True)
        if "load" in only:
            results.append(scenarios.load(infra, agents=cfg["agents"], seconds=cfg["load_seconds"]))
            print(json.dumps(results[-1]), flush=True)
        if "model" in only and cfg["model_examples"]:
            results.append(_model(cfg["model_examples"], infra.pg.url("nf_model")))
            print(json.dumps(results[-1]), flush=True)
    finally:
        infra.close(keep=args.keep)
    print()
    print(_table(results))
    ok = all(r["ok"] for r in results)
    print(f"harness: {'all guarantees held' if ok else 'A GUARANTEE FAILED'} in {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"ok": ok, "results": results}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
