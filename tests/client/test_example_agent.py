"""examples/agent.py runs to completion against a demo server: daphne and the lease reconciler
(as `make run` starts them) on the test database with the demo project loaded."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from novelforge_sessions.control.models import ConsumeReceipt, Handoff
from novelforge_sessions.lifecycles import HandoffState, SessionStatus
from novelforge_sessions.management.commands.load_demo import demo_token
from novelforge_sessions.models import RuntimeAttachment, Session
from reviews.models import Verdict

from tests.support.servers import ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_example_agent_runs_a_whole_session(server):
    call_command("load_demo", stdout=open(os.devnull, "w"))
    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONPATH": str(ROOT),
           "DJANGO_SETTINGS_MODULE": "novelforge_sessions.settings"}
    reconciler = subprocess.Popen([sys.executable, "manage.py", "reconcile_runtimes", "--loop", "--interval", "0.5"],
                                  cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        agent = subprocess.run(
            [sys.executable, "examples/agent.py", "--url", server.url, "--token", demo_token(), "--lease", "2",
             "--timeout", "60"],
            cwd=ROOT, env={**env, "NOVELFORGE_TOKEN": ""}, capture_output=True, text=True, timeout=240,
        )
    finally:
        reconciler.terminate()
        reconciler.wait(timeout=30)
    assert agent.returncode == 0, agent.stdout[-3000:] + agent.stderr[-3000:]
    out = agent.stdout
    for n in range(1, 7):
        assert f"==> {n}." in out, out
    assert "resume of session" in out and "(dry run: nothing changed)" in out and ": OK" in out
    s = Session.objects.get(runtime_family="example-agent")
    assert s.status == SessionStatus.COMPLETED and s.generation == 2 and s.run_count == 2
    first, second = RuntimeAttachment.objects.filter(session=s).order_by("generation")
    assert first.end_reason and second.ended_at is not None
    handoff = Handoff.objects.get(session=s)
    assert handoff.state == HandoffState.BOUND and ConsumeReceipt.objects.filter(logical_id=handoff.logical_id).count() == 1
    (verdict,) = Verdict.objects.filter(packet__gate__session=s)
    reviewer = get_user_model().objects.get(username="reviewer")
    assert verdict.channel == Verdict.Channel.PAGE and verdict.reviewer == f"user:{reviewer.id}"
