"""The goals of issue 13 in one table: `python bench/run.py [--quick] [--rounds N]` (bench/README.md).

Every row is a goal with its measured value, its target and met/missed, from this run only.
Ratios are computed between scenarios of the same round and then summarised over the rounds
(median, with min-max when there are several). On a shared machine the stable figure is the
server's CPU time per request (read from /proc for the server's processes), so the API ratios
are CPU ratios; the throughput ratio of the same pair is in each row's detail.

Plug-in modules. Any of ``bench/stream.py`` and ``bench/scaling.py`` (or another name in
``PLUGINS``) that exists is imported and asked for its rows:

    def goals(quick: bool, server_url: str) -> list[dict]

each row a dict with ``goal`` (str), ``measured`` (str or number), ``target`` (str),
``met`` (bool, or None when the row is informational) and ``detail`` (str). ``server_url`` is
the PostgreSQL server URL (``postgresql://user@host:port/postgres``; the module makes its own
databases there). A module that raises gets one row saying so (met None), the table still prints.
"""
from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
PLUGINS = ("stream", "scaling")
CLIENTS = 8  # the "8 clients"


def scenarios(quick: bool) -> dict[str, list[str]]:
    """name -> workloads.py arguments (besides --db-url/--log-file)."""
    n = 500 if quick else 1500
    secs = "20" if quick else "40"
    http = ["--scenario", "http", "--workers", str(CLIENTS), "--max-seconds", secs]
    # In this order (reversed every other round): the rate ratio P5 compares two neighbours,
    # "single" and "stream_on", so that the machine's load drifts as little as possible between
    # them; the CPU ratios (the other goals) hold up across the plan.
    plan = {
        "floor": [*http, "--kind", "floor", "--steps", str(n)],
        "single": [*http, "--kind", "single", "--steps", str(n)],
        "stream_on": [*http, "--kind", "single", "--steps", str(n), "--subscribers", "10"],
        "uvicorn": [*http, "--kind", "single", "--steps", str(n), "--server", "uvicorn"],
        "dbos": ["--scenario", "dbos_step_in_workflow", "--workers", str(CLIENTS), "--steps", str(n),
                 "--max-seconds", secs, "--fast"],
        "langgraph": ["--scenario", "langgraph_sync", "--workers", str(CLIENTS), "--steps", str(n), "--max-seconds", secs],
        "batch": [*http, "--kind", "batch", "--steps", str(n // 5)],
    }
    if not quick:
        plan["full_stack"] = [*http, "--kind", "single", "--steps", str(n), "--lean", "0"]
        plan["uvicorn_x2"] = [*http, "--kind", "single", "--steps", str(n), "--server", "uvicorn",
                              "--server-workers", "2"]
    return plan


def sustained(quick: bool) -> list[str]:
    secs = 15 if quick else 90
    return ["--scenario", "http", "--workers", "4", "--kind", "single", "--steps", "10000000",
            "--max-seconds", str(secs), "--rss-after", "0.2"]


# ---------------------------------------------------------------- summarising
def _summary(values: list[float], fmt: str = ".2f") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def _ratio_rows(rounds: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    def per_round(fn: Callable[[dict[str, dict[str, Any]]], float | None]) -> list[float]:
        out = []
        for r in rounds:
            try:
                value = fn(r)
            except (KeyError, TypeError, ZeroDivisionError):
                value = None
            if value is not None:
                out.append(value)
        return out

    def cpu(r: dict, name: str, per: str = "cpu_ms_per_request") -> float:
        return r[name][per]

    def row(goal: str, target: float, values: list[float], detail: str, *, higher: bool = True,
            target_text: str | None = None, informational: bool = False) -> dict[str, Any]:
        med = statistics.median(values) if values else None
        met = None if med is None or informational else (med >= target if higher else med <= target)
        return {"goal": goal, "measured": _summary(values) + ("×" if higher and target_text is None else ""),
                "target": target_text or f"≥ {target}×", "met": met, "detail": detail}

    single_cpu = per_round(lambda r: cpu(r, "single"))
    floor_cpu = per_round(lambda r: cpu(r, "floor"))
    batch_cpu = per_round(lambda r: cpu(r, "batch", "cpu_ms_per_step"))
    rows = [
        row("checkpoint POST vs bare django-ninja one-insert endpoint (8 clients, daphne, make-run config)", 0.8,
            per_round(lambda r: cpu(r, "floor") / cpu(r, "single")),
            f"CPU ratio floor/ours; server CPU ms/request ours {_summary(single_cpu)}, floor {_summary(floor_cpu)}; "
            f"throughput ratio {_summary(per_round(lambda r: r['single']['requests_per_s'] / r['floor']['requests_per_s']))}"),
        row("checkpoint POST vs DBOS step-in-workflow (in-process, 8 workers)", 1.5,
            per_round(lambda r: r["dbos"]["cpu_ms_per_step"] / cpu(r, "single")),
            f"CPU ratio DBOS/ours per step; DBOS {_summary(per_round(lambda r: r['dbos']['cpu_ms_per_step']))} ms; "
            f"throughput ratio {_summary(per_round(lambda r: r['single']['steps_per_s'] / r['dbos']['steps_per_s']))}"),
        row("checkpoint POST vs LangGraph superstep (PostgresSaver, sync), one per request", 0.8,
            per_round(lambda r: r["langgraph"]["cpu_ms_per_step"] / cpu(r, "single")),
            f"CPU ratio LangGraph/ours per step; LangGraph {_summary(per_round(lambda r: r['langgraph']['cpu_ms_per_step']))} ms; "
            f"throughput ratio {_summary(per_round(lambda r: r['single']['steps_per_s'] / r['langgraph']['steps_per_s']))}"),
        row("batch of 10 checkpoints vs LangGraph superstep, per checkpoint", 1.5,
            per_round(lambda r: r["langgraph"]["cpu_ms_per_step"] / cpu(r, "batch", "cpu_ms_per_step")),
            f"CPU ms per checkpoint in a batch {_summary(batch_cpu)}; "
            f"throughput ratio {_summary(per_round(lambda r: r['batch']['steps_per_s'] / r['langgraph']['steps_per_s']))}; "
            f"vs DBOS (CPU) {_summary(per_round(lambda r: r['dbos']['cpu_ms_per_step'] / cpu(r, 'batch', 'cpu_ms_per_step')))}×"),
        row("P5: writers' insert rate with live streaming on (10 subscribers) vs off", 0.8,
            per_round(lambda r: r["stream_on"]["requests_per_s"] / r["single"]["requests_per_s"]),
            f"CPU ms/request on {_summary(per_round(lambda r: cpu(r, 'stream_on')))} vs off {_summary(single_cpu)} "
            f"(on includes delivering every event to 10 sockets; the subscribers run in a process of their own); "
            f"events delivered {_summary(per_round(lambda r: r['stream_on']['events_received']), '.0f')} of "
            f"{_summary(per_round(lambda r: r['stream_on'].get('events_expected', 0)), '.0f')}, in "
            f"{_summary(per_round(lambda r: r['stream_on'].get('frames_received')), '.0f')} frames"),
        row("server choice: the production server (uvicorn, python -m novelforge_sessions.serve) vs daphne (informational)", 0.0,
            per_round(lambda r: cpu(r, "single") / cpu(r, "uvicorn")),
            f"CPU ratio daphne/uvicorn (>1: uvicorn cheaper); uvicorn {_summary(per_round(lambda r: cpu(r, 'uvicorn')))} ms/request; "
            f"throughput ratio uvicorn/daphne {_summary(per_round(lambda r: r['uvicorn']['requests_per_s'] / r['single']['requests_per_s']))}",
            target_text="choose by it", informational=True),
        row("checkpoint POST as the production server serves it vs DBOS (informational: the goals above are daphne's)", 0.0,
            per_round(lambda r: r["dbos"]["cpu_ms_per_step"] / cpu(r, "uvicorn")),
            f"CPU ratio DBOS/ours per step; vs LangGraph, one per request: "
            f"{_summary(per_round(lambda r: r['langgraph']['cpu_ms_per_step'] / cpu(r, 'uvicorn')))}×",
            target_text="-", informational=True),
    ]
    if all("full_stack" in r for r in rounds):
        rows.append(row("lean /api/v1/ path vs the full middleware stack (informational)", 0.0,
                        per_round(lambda r: cpu(r, "full_stack") / cpu(r, "single")),
                        f"CPU ratio full/lean; full stack {_summary(per_round(lambda r: cpu(r, 'full_stack')))} ms/request",
                        target_text="-", informational=True))
    if all("uvicorn_x2" in r for r in rounds):
        rows.append(row("uvicorn, 2 processes behind one port vs 1 (throughput, informational)", 0.0,
                        per_round(lambda r: r["uvicorn_x2"]["requests_per_s"] / r["uvicorn"]["requests_per_s"]),
                        f"req/s x2 {_summary(per_round(lambda r: r['uvicorn_x2']['requests_per_s']), '.0f')}, "
                        f"x1 {_summary(per_round(lambda r: r['uvicorn']['requests_per_s']), '.0f')}",
                        target_text="-", informational=True))
    return rows


def plugin_rows(quick: bool, server_url: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in PLUGINS:
        path = BENCH_DIR / f"{name}.py"
        if not path.exists():
            rows.append({"goal": f"bench/{name}.py", "measured": "-", "target": "-", "met": None,
                         "detail": "module not present on this branch"})
            continue
        try:
            spec = importlib.util.spec_from_file_location(f"nfbench_{name}", path)
            module = importlib.util.module_from_spec(spec)
            assert spec.loader is not None
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            got = module.goals(quick, server_url)
            for r in got:
                missing = {"goal", "measured", "target", "met", "detail"} - set(r)
                if missing:
                    raise ValueError(f"row {r!r} lacks {sorted(missing)}")
            rows.extend(got)
        except Exception as exc:
            traceback.print_exc()
            rows.append({"goal": f"bench/{name}.py", "measured": "ERROR", "target": "-", "met": None,
                         "detail": f"{type(exc).__name__}: {exc}"[:300]})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    def met(v: Any) -> str:
        return "MET" if v is True else "MISSED" if v is False else "-"

    widths = [max(len("goal"), *(len(str(r["goal"])) for r in rows)), max(8, *(len(str(r["measured"])) for r in rows)),
              max(6, *(len(str(r["target"])) for r in rows)), 6]
    widths[0] = min(widths[0], 96)
    head = f"{'goal':<{widths[0]}}  {'measured':<{widths[1]}}  {'target':<{widths[2]}}  {'met':<6}  detail"
    print()
    print(head)
    print("-" * min(len(head) + 40, 220))
    for r in rows:
        print(f"{str(r['goal'])[:widths[0]]:<{widths[0]}}  {str(r['measured']):<{widths[1]}}  {str(r['target']):<{widths[2]}}  "
              f"{met(r['met']):<6}  {r['detail']}")
    print()
    print("measured: median over the rounds (min–max). API ratios are server CPU ms per request/step, read from /proc;")
    print("the throughput ratio of the same pair is in the detail. Every pair comes from the same round.")


def summarise(rounds: list[dict[str, dict[str, Any]]], drift: list[dict[str, Any]], plugins: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = _ratio_rows(rounds)
    values = [d["rss_drift"] * 100 for d in drift if d.get("rss_drift") is not None]
    med = statistics.median(values) if values else None
    rows.append({
        "goal": "server RSS drift over sustained load (checkpoint POSTs, 4 clients)",
        "measured": _summary(values, ".1f") + " %", "target": "≤ 10 %", "met": None if med is None else med <= 10,
        "detail": "; ".join(f"{d['rss_start_bytes'] / 2**20:.0f} → {d['rss_end_bytes'] / 2**20:.0f} MiB over "
                            f"{d['requests']} requests in {d['elapsed_s']:.0f} s" for d in drift if "requests" in d),
    })
    return rows + plugins


def dump(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
