"""The goals table: `python bench/run.py [--quick] [--rounds N]` (bench/README.md).

Every goal is a ratio of **steps per second of whole workloads** (``bench/users.py``: 8 client
processes, client, server and PostgreSQL on this machine's cores, a fixed window), taken between
workloads of the same round and summarised over the rounds as the median of the per-round
ratios, with min-max when there are several. Beside each workload's steps/s the table prints the
whole machine's CPU per step (``/proc/stat``); the server's own CPU is a diagnostic column, never
a verdict. Two counts on the server (P2, P3) and the sustained RSS row complete it.

Plug-in modules. Any of ``bench/stream.py``, ``bench/scaling.py``, ``bench/fleet.py`` (or another name in
``PLUGINS``) that exists is imported and asked for its rows:

    def goals(quick: bool, server_url: str) -> list[dict]

each row a dict with ``goal`` (str), ``measured`` (str or number), ``target`` (str),
``met`` (bool, or None when the row is informational) and ``detail`` (str). ``server_url`` is
the PostgreSQL server URL (``postgresql://user@host:port/postgres``; the module makes its own
databases there, named after ``NFBENCH_DB_PREFIX``). A module that raises gets one row saying so
(met None), the table still prints.
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
PLUGINS = ("stream", "scaling", "fleet")
CLIENTS = 8  # the "8 clients"
#: The workloads of one round, in this order (reversed every other round). Pairs that a goal
#: compares sit near each other where they can.
WORKLOADS = ("client", "langgraph_pg", "dbos", "langgraph_ours", "langgraph_ours_async", "langgraph_pg_async",
             "batch", "raw", "stream_on", "mcp", "floor")
#: Which database each workload uses (the others use ours).
DATABASE_OF = {"langgraph_pg": "langgraph", "langgraph_pg_async": "langgraph", "dbos": "dbos"}
WHAT = {
    "client": "novelforge_client.Client.checkpoint() as shipped (fresh idempotency key per call)",
    "langgraph_ours": "LangGraph loop graph on NovelForgeSaver, durability=sync (per superstep)",
    "langgraph_pg": "LangGraph loop graph on PostgresSaver, durability=sync (per superstep)",
    "langgraph_ours_async": "the same graph with ainvoke, on NovelForgeSaver's async methods (per superstep)",
    "langgraph_pg_async": "the same graph with ainvoke, on AsyncPostgresSaver (per superstep)",
    "dbos": "DBOS workflow looping over @DBOS.step() (per step)",
    "raw": "raw POST /runs/{id}/checkpoints, no idempotency key, http.client (reference)",
    "batch": "POST /runs/{id}/batch of 10 checkpoints (reference; per checkpoint)",
    "stream_on": "raw, with 10 websocket subscribers on the project (P5)",
    "mcp": "MCP checkpoint tool, SDK client over stdio, one novelforge-mcp per client",
    "floor": "bare django-ninja one-insert endpoint, same ASGI entry and server as ours",
}


def window_seconds(quick: bool) -> float:
    return 5.0 if quick else 10.0


def scenarios(quick: bool) -> dict[str, list[str]]:
    """name -> users.py arguments (besides --db-url/--log-file)."""
    secs = str(window_seconds(quick))
    return {name: ["--workload", name, "--clients", str(CLIENTS), "--seconds", secs] for name in WORKLOADS}


def counts(quick: bool) -> dict[str, list[str]]:
    """The write counts on the server, once per run."""
    n = "50" if quick else "100"
    return {"p2": ["--workload", "p2", "--count", n], "p3": ["--workload", "p3", "--count", n]}


#: The soak: 4 writers, 10 websockets subscribed to the project, a manager reloading pages every second.
SOAK_SUBSCRIBERS = 10
SOAK_PAGES_EVERY_S = 1.0


def sustained(quick: bool) -> list[str]:
    """The soak's arguments: 10 minutes in the full run (15 s quick), RSS sampled 20 % in and at the end."""
    secs = 15 if quick else 600
    return ["--scenario", "http", "--workers", "4", "--kind", "single", "--steps", "1000000000",
            "--max-seconds", str(secs), "--rss-after", "0.2", "--subscribers", str(SOAK_SUBSCRIBERS),
            "--pages", str(SOAK_PAGES_EVERY_S)]


# ---------------------------------------------------------------- summarising
def _summary(values: list[float], fmt: str = ".2f") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def per_round(rounds: list[dict[str, dict[str, Any]]], fn: Callable[[dict[str, dict[str, Any]]], float | None]) -> list[float]:
    out = []
    for r in rounds:
        try:
            value = fn(r)
        except (KeyError, TypeError, ZeroDivisionError):
            value = None
        if value is not None:
            out.append(value)
    return out


def workload_rows(rounds: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per workload: steps/s, machine CPU ms per step, server CPU ms per step (diagnostic)."""
    rows = []
    for name in WORKLOADS:
        def get(key: str, sub: str | None = None) -> list[float]:
            return per_round(rounds, lambda r: r[name][key][sub] if sub else r[name][key])

        rows.append({"workload": name, "what": WHAT[name], "rounds": len(get("steps_per_s")),
                     "steps_per_s": _summary(get("steps_per_s"), ".0f"),
                     "machine_cpu_ms_per_step": _summary(get("machine_cpu_ms_per_step")),
                     "server_cpu_ms_per_step": _summary(get("server_cpu_ms_per_step")),
                     "own_cpu_ms_per_step": _summary(get("own_cpu_ms_per_step")),
                     "p50_ms": _summary(get("latency_ms", "p50"), ".1f"),
                     "busy_cores": _summary(get("machine_busy_cores"))})
    return rows


def _ratio_rows(rounds: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    def rate(a: str, b: str) -> list[float]:
        return per_round(rounds, lambda r: r[a]["steps_per_s"] / r[b]["steps_per_s"])

    def cpu(a: str, b: str) -> str:
        return _summary(per_round(rounds, lambda r: r[a]["machine_cpu_ms_per_step"] / r[b]["machine_cpu_ms_per_step"]))

    def row(goal: str, a: str, b: str, target: float, *, informational: bool = False) -> dict[str, Any]:
        values = rate(a, b)
        med = statistics.median(values) if values else None
        met = None if med is None or informational else med >= target
        return {"goal": goal, "measured": _summary(values) + "×", "target": "-" if informational else f"≥ {target}×",
                "met": met, "detail": f"steps/s {a}/{b}, same round; machine CPU per step {a}/{b} {cpu(a, b)}×"}

    rows = [
        row("shipped client checkpoint vs DBOS step-in-workflow (steps/s)", "client", "dbos", 1.5),
        row("shipped client checkpoint vs LangGraph PostgresSaver superstep (steps/s)", "client", "langgraph_pg", 1.0),
        row("LangGraph graph on NovelForgeSaver vs the same graph on PostgresSaver", "langgraph_ours", "langgraph_pg", 0.8),
        row("batch of 10 vs LangGraph PostgresSaver, per checkpoint", "batch", "langgraph_pg", 3.0),
        row("P5: writers' rate with 10 websocket subscribers vs none (raw POST)", "stream_on", "raw", 0.8),
        row("raw POST (no key) vs the floor: bare django-ninja one-insert (informational)", "raw", "floor", 0.0,
            informational=True),
        row("shipped client vs raw POST (informational)", "client", "raw", 0.0, informational=True),
        row("MCP checkpoint tool vs shipped client (informational)", "mcp", "client", 0.0, informational=True),
        row("LangGraph ainvoke on NovelForgeSaver vs on AsyncPostgresSaver (informational)", "langgraph_ours_async",
            "langgraph_pg_async", 0.0, informational=True),
    ]
    got = per_round(rounds, lambda r: r["stream_on"]["events_received"] / r["stream_on"]["events_expected"])
    if got:
        rows[4]["detail"] += f"; events delivered / expected {_summary(got, '.3f')}"
    return rows


def count_rows(p2: dict[str, Any], p3: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    if "write_xacts_per_checkpoint" in p2:
        v = p2["write_xacts_per_checkpoint"]
        rows.append({"goal": "P2: write transactions per Client.checkpoint(), counted on the server", "measured": f"{v:.3f}",
                     "target": "≤ 1", "met": v <= 1.0,
                     "detail": f"distinct writer xids of our database per checkpoint ({p2['checkpoints_per_try']} per try, "
                               f"worst try); rows per checkpoint {p2['rows_per_checkpoint']}; cluster-wide xids per "
                               f"checkpoint {p2['cluster_xids_per_checkpoint']} (other writers on the cluster add to it)"})
    else:
        rows.append({"goal": "P2: write transactions per Client.checkpoint()", "measured": "ERROR", "target": "≤ 1",
                     "met": None, "detail": str(p2.get("error") or p2.get("skipped"))})
    if "rows_per_replay" in p3:
        v = p3["rows_per_replay"]
        rows.append({"goal": "P3: rows written by an already_consumed result replay", "measured": f"{v:.3f}",
                     "target": "≤ 1 (its delivery row)", "met": v <= 1.0 and set(p3["rows_per_replay_by_table"]) <= {"control_resultdelivery"},
                     "detail": f"{p3['replays']} replays, pg_stat_user_tables deltas per replay minus a baseline of as many "
                               f"reads: {p3['rows_per_replay_by_table']}"})
    else:
        rows.append({"goal": "P3: rows written by an already_consumed replay", "measured": "ERROR", "target": "≤ 1",
                     "met": None, "detail": str(p3.get("error") or p3.get("skipped"))})
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


def print_workloads(rows: list[dict[str, Any]]) -> None:
    head = (f"{'workload':<21}{'steps/s':>14}{'machine CPU ms/step':>24}{'own CPU ms/step*':>24}{'server CPU ms/step*':>24}"
            f"{'p50 ms':>20}  what")
    print()
    print(head)
    print("-" * (len(head) + 40))
    for r in rows:
        print(f"{r['workload']:<21}{r['steps_per_s']:>14}{r['machine_cpu_ms_per_step']:>24}{r['own_cpu_ms_per_step']:>24}"
              f"{r['server_cpu_ms_per_step']:>24}{r['p50_ms']:>20}  {r['what']}")
    print("* diagnostics only, never a verdict: own = the workload's processes (clients, server, MCP servers) and its")
    print("  database's PostgreSQL backends, which other tenants of the machine do not inflate; server = the server process alone.")


def print_table(rows: list[dict[str, Any]]) -> None:
    """goal | met | measured | target | detail: the verdict beside the goal, however long the figures."""
    def met(v: Any) -> str:
        return "MET" if v is True else "MISSED" if v is False else "-"

    goal_w = min(96, max(len("goal"), *(len(str(r["goal"])) for r in rows)))
    head = f"{'goal':<{goal_w}}  {'met':<6}  measured  [target]  detail"
    print()
    print(head)
    print("-" * min(len(head) + 60, 220))
    for r in rows:
        print(f"{str(r['goal'])[:goal_w]:<{goal_w}}  {met(r['met']):<6}  {r['measured']}  [{r['target']}]  {r['detail']}")
    print()
    print("measured: median over the rounds of the per-round ratio (min–max). Every ratio is steps per second of two")
    print("whole workloads of the same round (8 client processes, client + server + PostgreSQL on this machine).")


def summarise(rounds: list[dict[str, dict[str, Any]]], drift: list[dict[str, Any]], plugins: list[dict[str, Any]],
              p2: dict[str, Any], p3: dict[str, Any]) -> list[dict[str, Any]]:
    rows = _ratio_rows(rounds) + count_rows(p2, p3)
    values = [d["rss_drift"] * 100 for d in drift if d.get("rss_drift") is not None]
    med = statistics.median(values) if values else None
    # The soak holds only if nothing failed along the way: every page answered, every event delivered.
    whole = all(d.get("page_error_count", 0) == 0 and d.get("events_received") == d.get("events_expected") for d in drift)
    rows.append({
        "goal": "server RSS drift over a soak (checkpoint POSTs, 4 clients, 10 websockets, pages every 1 s)",
        "measured": _summary(values, ".1f") + " %", "target": "≤ 10 %, 0 page errors, every event delivered",
        "met": None if med is None else (med <= 10 and whole),
        "detail": "; ".join(f"{d['rss_start_bytes'] / 2**20:.0f} → {d['rss_end_bytes'] / 2**20:.0f} MiB over "
                            f"{d['requests']} requests in {d['elapsed_s']:.0f} s; {d.get('pages', 0)} pages "
                            f"(p99 {d.get('page_p99_ms')} ms, {d.get('page_error_count', 0)} errors"
                            f"{': ' + ', '.join(d['page_errors'][:3]) if d.get('page_errors') else ''}); "
                            f"events {d.get('events_received')} of {d.get('events_expected')}"
                            for d in drift if "requests" in d),
    })
    return rows + plugins


def dump(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
