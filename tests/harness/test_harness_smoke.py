"""``python -m harness`` in its smallest configuration, so the harness cannot rot: every fault
runs one round against real daphne, a throwaway PostgreSQL cluster and redis-server, and the
printed figures say 0 duplicates and 0 lost acknowledgements everywhere, with the kill points
really fired by the hook and the server never restarted by the PostgreSQL faults."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.support.servers import ROOT


def test_the_harness_runs_and_every_guarantee_holds(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "--profile", "quick", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    figures = json.loads(out.read_text())
    assert figures["ok"] is True
    by_fault = {r["fault"]: r for r in figures["results"]}
    checkpoint_faults = {"kill checkpoint before_commit", "kill checkpoint after_commit"}
    assert set(by_fault) == {"kill before_commit", "kill after_commit", "postgres restart + pg_terminate_backend",
                             "redis restart (2 servers, open websockets)", "load", *checkpoint_faults}
    for name, r in by_fault.items():
        assert r["ok"] is True, (name, r)
        assert (r["duplicates"], r["lost"]) == (0, 0), (name, r)
        assert r["acknowledged"] > 0, (name, r)
    for point in ("before_commit", "after_commit"):
        r = by_fault[f"kill {point}"]
        assert r["rounds"] == r["killed_by_hook"] == 1, r
        assert r["history"].get("unknown", 0) + r["history"].get("fail", 0) > 0, "the kill cost some client a request"
    for name in checkpoint_faults:
        r = by_fault[name]
        assert r["rounds"] == r["killed_by_hook"] == 1 and r["seq_gaps"] == 0, r
        assert r["rows"] == r["acknowledged"] + r["steps_unacknowledged_written"], r
    pg = by_fault["postgres restart + pg_terminate_backend"]
    assert pg["rounds"] == 2 and pg["server_restarted"] is False and pg["server_500"] == 0, pg
    redis = by_fault["redis restart (2 servers, open websockets)"]
    assert (redis["gaps"], redis["out_of_order"]) == (0, 0) and redis["resumes"] >= 1 and redis["servers_alive"], redis
    load = by_fault["load"]
    assert load["server_5xx"] == 0 and load["cycles"] > 0 and load["peak_db_connections"] >= 1, load
    # The printed table names every fault with its counts.
    for name in by_fault:
        if name != "load":
            assert name in proc.stdout
    assert "harness: all guarantees held" in proc.stdout
