"""`make serve-cluster`: N production server processes (uvicorn, `python -m novelforge_sessions.serve`)
on consecutive ports sharing Redis, the reconciler as its own process, all stopped together (read
from the recipe: `make -n` runs nothing)."""
from __future__ import annotations

import os
import re
import subprocess

from tests.support.servers import ROOT


def recipe(*args: str) -> str:
    # Under `make test` this runs as a sub-make: keep its "Entering directory" lines out.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"}}
    return subprocess.run(["make", "--no-print-directory", "-n", "serve-cluster", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True).stdout


def test_serve_cluster_starts_n_processes_with_redis_and_the_reconciler_and_stops_them_together():
    text = recipe("N=3", "CLUSTER_BASE_PORT=9101")
    assert 'export REDIS_URL="${REDIS_URL:-redis://' in text and ".ping()" in text  # refuses to start without Redis
    assert "for i in $(seq 0 $(( 3 - 1 ))); do" in text and "port=$(( 9101 + i ))" in text
    assert re.search(r"-m novelforge_sessions\.serve --host \S+ --port \$port &\n\s*pids=\"\$pids \$!\"", text)
    assert re.search(r"reconcile_runtimes --loop --interval \S+ &\n\s*pids=\"\$!\"", text)
    assert re.search(r"trap 'kill \$pids[^']*' EXIT", text) and "trap 'exit 143' TERM" in text
    assert text.rstrip().endswith("wait -n"), "any process ending stops the others"
    assert not re.search(r"exec \S*(daphne|novelforge_sessions\.serve)", text)


def test_serve_cluster_defaults_to_two_processes_on_the_ports_of_deploy_nginx_conf():
    text = recipe()
    assert "$(seq 0 $(( 2 - 1 )))" in text and "port=$(( 8001 + i ))" in text
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "server 127.0.0.1:8001" in conf and "server 127.0.0.1:8002" in conf
