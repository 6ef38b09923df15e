"""`make run` starts the lease reconciler beside the server and stops it with the server."""
from __future__ import annotations

import re
import subprocess

import pytest
from django.conf import settings

from tests.support.servers import ROOT


def _run_recipe() -> str:
    # -n prints the recipe without running it (nothing is bootstrapped, served or migrated).
    return subprocess.run(["make", "--no-print-directory", "-n", "run"], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_make_run_starts_the_reconciler_loop_in_the_background_and_traps_its_end():
    recipe = _run_recipe()
    started = re.search(r"manage\.py reconcile_runtimes --loop --interval (\S+) &\n\s*reconciler=\$!", recipe)
    assert started, recipe
    assert float(started.group(1)) * 3 <= settings.RUNTIME_LEASE_SECONDS, "reconciled well within one lease"
    assert re.search(r"trap 'kill \$reconciler[^']*' EXIT", recipe), "stopped whenever the recipe's shell ends"
    daphne = recipe.index("daphne -b")
    assert recipe.index("reconcile_runtimes --loop") < daphne
    assert not re.search(r"exec \S*daphne", recipe), "exec would replace the shell and drop the trap"
    assert 'echo "Serving on http://' in recipe


def test_make_run_keeps_the_default_sweep_because_notify_wakes_the_server():
    """In-memory layer (no REDIS_URL): the reconciler's events reach open pages through PostgreSQL
    NOTIFY (tests/live/test_pg_notify.py), so `make run` no longer shortens the 15 s sweep."""
    recipe = _run_recipe()
    assert "LIVE_SWEEP_SECONDS=" not in recipe and "LIVE_PG_NOTIFY=" not in recipe, recipe


def test_make_run_prints_the_address_it_serves_on():
    """The printed curl line and the banner follow RUN_HOST / RUN_PORT."""
    recipe = subprocess.run(["make", "--no-print-directory", "-n", "run", "RUN_HOST=127.0.0.2", "RUN_PORT=8123"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    assert "manage.py load_demo --base-url http://127.0.0.2:8123\n" in recipe, recipe
    assert 'echo "Serving on http://127.0.0.2:8123/"' in recipe
    assert "daphne -b 127.0.0.2 -p 8123 " in recipe
    assert ":8000" not in recipe


@pytest.mark.django_db
def test_load_demo_prints_a_curl_line_for_the_given_address():
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("load_demo", "--base-url", "http://127.0.0.2:8123", stdout=out)
    curl = [line for line in out.getvalue().splitlines() if "curl" in line]
    assert len(curl) == 1 and curl[0].endswith(" http://127.0.0.2:8123/api/v1/sessions"), out.getvalue()
    out = StringIO()
    call_command("load_demo", "--base-url", "http://0.0.0.0:9001/", stdout=out)  # bound everywhere: loopback
    assert out.getvalue().rstrip().endswith(" http://127.0.0.1:9001/api/v1/sessions"), out.getvalue()


def test_make_run_and_serve_cluster_start_the_webhook_sender_and_the_mailer_and_stop_them():
    recipe = _run_recipe()
    for command, var in (("send_webhooks", "sender"), ("send_notifications", "mailer")):
        assert re.search(rf"manage\.py {command} --loop --interval \S+ &\n\s*{var}=\$!", recipe), recipe
        assert re.search(rf"trap 'kill [^']*\${var}\b[^']*' EXIT", recipe), f"{command} stopped with the server"
        assert recipe.index(f"{command} --loop") < recipe.index("daphne -b")
    cluster = subprocess.run(["make", "--no-print-directory", "-n", "serve-cluster"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    for command in ("reconcile_runtimes", "send_webhooks", "send_notifications"):
        assert re.search(rf"manage\.py {command} --loop --interval \S+ &\n\s*pids=\"\$pids \$!\"|"
                         rf"manage\.py {command} --loop --interval \S+ &\n\s*pids=\"\$!\"", cluster), (command, cluster)
