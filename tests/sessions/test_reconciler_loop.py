"""``reconcile_runtimes --loop`` as a real process against the test database."""
from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from novelforge_sessions.models import RuntimeAttachment, Session

from tests.support.factories import running_session
from tests.support.servers import ROOT, database_url
from tests.support.waits import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_loop_mode_reconciles_leases_as_they_expire():
    s = running_session("loop", task_mode="t")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "reconcile_runtimes", "--loop", "--interval", "0.2"],
        cwd=ROOT, env={**os.environ, "DATABASE_URL": database_url()}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    expected = f"session {s.id} lost; session is failed"
    out = ""
    os.set_blocking(proc.stdout.fileno(), False)
    try:
        RuntimeAttachment.objects.filter(session_id=s.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        wait_until(lambda: Session.objects.get(id=s.id).status == "failed", "the loop to fail the session", timeout=30)
        # The loop reports the pass after its commit: read its output until the line is there
        # (terminating it as soon as the status changed could come before the print).

        def printed() -> bool:
            nonlocal out
            out += (proc.stdout.read() or b"").decode()
            return expected in out

        wait_until(printed, "the loop to report the pass", timeout=30)
        assert proc.poll() is None, "the loop keeps running"
    finally:
        proc.terminate()
        os.set_blocking(proc.stdout.fileno(), True)
        out += proc.communicate(timeout=10)[0].decode()
    assert expected in out
