"""The harness's test-only fault hook (novelforge_sessions/faults.py): off by default, refused
with a deployment's key, strictly parsed, and it really kills the process at the commit."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django.conf import settings

from novelforge_sessions import faults
from tests.support.servers import ROOT

SPEC = "before_commit:1:/results$"


def _django(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in {"NOVELFORGE_FAULT_POINTS", "SECRET_KEY", "REQUIRE_SECRET_KEY"}}
    script = "import django, os; os.environ['DJANGO_SETTINGS_MODULE'] = 'novelforge_sessions.settings'; django.setup()\n" + code
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**base, **env}, capture_output=True, text=True,
                          timeout=120)


def test_off_unless_the_environment_sets_it(db: None) -> None:
    assert settings.FAULT_POINTS == []
    assert "novelforge_sessions.faults.FaultMiddleware" not in settings.MIDDLEWARE
    # The hook is not installed in this (test) process: no receiver, no connection watched.
    from django.db import connection
    from django.db.backends.signals import connection_created

    assert not connection_created.disconnect(dispatch_uid="novelforge_sessions.faults")
    connection.ensure_connection()
    assert connection.connection not in faults._watched


@pytest.mark.parametrize("env", [
    {"SECRET_KEY": "a-deployment-key-" + "x" * 40},
    {"REQUIRE_SECRET_KEY": "true", "SECRET_KEY": "a-deployment-key-" + "y" * 40},
])
def test_refused_with_a_deployment_key(env):
    proc = _django("", NOVELFORGE_FAULT_POINTS=SPEC, **env)
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr and "test-only hook" in proc.stderr, proc.stderr[-800:]


@pytest.mark.parametrize("spec", ["explode:1:/x", "before_commit:0:/x", "before_commit:one:/x", "after_commit", ",",
                                  "after_commit:1:("])
def test_malformed_specs_are_refused(spec):
    with pytest.raises(ValueError):
        faults.parse(spec)


def test_parse():
    (a, b) = faults.parse("before_commit:2:/results$, after_commit:5:/handoffs$")
    assert (a.point, a.nth, a.path.pattern) == ("before_commit", 2, "/results$")
    assert (b.point, b.nth, b.path.pattern) == ("after_commit", 5, "/handoffs$")


KILL_AT_SECOND_COMMIT = """
from django.db import connection, transaction
from novelforge_sessions import faults
token = faults._current_path.set("/api/v1/handoffs/1/results")
for n in range(3):
    with transaction.atomic():
        connection.cursor().execute("SELECT 1")
    print("committed", n + 1, flush=True)
"""


def test_the_process_kills_itself_at_the_nth_matching_commit():
    proc = _django(KILL_AT_SECOND_COMMIT, NOVELFORGE_FAULT_POINTS="before_commit:2:/results$")
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-800:])
    assert proc.stdout.split() == ["committed", "1"]  # the second commit never happened
    assert "fault point before_commit #2 on /api/v1/handoffs/1/results: SIGKILL" in proc.stderr


def test_other_paths_and_work_outside_requests_are_untouched():
    proc = _django(KILL_AT_SECOND_COMMIT, NOVELFORGE_FAULT_POINTS="before_commit:1:/handoffs$")
    assert proc.returncode == 0, proc.stderr[-800:]
    assert proc.stdout.split()[-2:] == ["committed", "3"]


# With psycopg's pool, closing hands the connection back and a later connect() may get the
# same one, with Django's connection_created sent again (as here, by hand, twice): its commit
# is wrapped once, so each commit still counts once. An atomic block whose transaction was
# already ended on the server (here by a statement carrying its own COMMIT), or that never
# began one, is no commit.
AGAIN = """
from django.db import connection, transaction
from django.db.backends.signals import connection_created
from novelforge_sessions import faults
token = faults._current_path.set("/api/v1/handoffs/1/results")
for n in range(3):
    with transaction.atomic():
        connection.cursor().execute("SELECT 1")
    print("committed", n + 1, flush=True)
    if n == 0:
        with transaction.atomic():
            connection.cursor().execute("SELECT 1; COMMIT")
        with transaction.atomic():
            pass
        print("not commits", flush=True)
        for _ in range(2):
            connection_created.send(sender=type(connection), connection=connection)
"""


def test_a_connection_handed_out_again_counts_each_commit_once() -> None:
    proc = _django(AGAIN, NOVELFORGE_FAULT_POINTS="before_commit:3:/results$", DB_POOL_MAX_SIZE="5")
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-800:])
    assert proc.stdout.splitlines() == ["committed 1", "not commits", "committed 2"]
    assert "fault point before_commit #3 on /api/v1/handoffs/1/results: SIGKILL" in proc.stderr
