"""``reconcile_runtimes --loop`` as a real process against the test database."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.models import RuntimeAttachment, Session

from tests.conftest import caller_for, make_project
from tests.live import ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)


def test_loop_mode_reconciles_leases_as_they_expire():
    who = caller_for(make_project("loop"))
    s = sessions.create_session(
        who, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="t", runtime_family="cli"),
        runtime=RuntimeSpec(runtime_family="cli"),
    )
    runs.start_run(who, s.id)
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "reconcile_runtimes", "--loop", "--interval", "0.2"],
        cwd=ROOT, env={**os.environ, "DATABASE_URL": database_url()}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    expected = f"session {s.id} lost; session is failed"
    out = ""
    os.set_blocking(proc.stdout.fileno(), False)
    try:
        RuntimeAttachment.objects.filter(session_id=s.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Session.objects.get(id=s.id).status != "failed":
            time.sleep(0.1)
        assert Session.objects.get(id=s.id).status == "failed"
        # The loop reports the pass after its commit: read its output until the line is there
        # (terminating it as soon as the status changed could come before the print).
        while time.monotonic() < deadline and expected not in out:
            out += (proc.stdout.read() or b"").decode()
            time.sleep(0.05)
        assert proc.poll() is None, "the loop keeps running"
    finally:
        proc.terminate()
        os.set_blocking(proc.stdout.fileno(), True)
        out += proc.communicate(timeout=10)[0].decode()
    assert expected in out
