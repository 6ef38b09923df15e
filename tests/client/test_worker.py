"""The worker loop in real processes against a real server: several copies compete for handoffs and
each handoff is executed and consumed exactly once (effects counted in the database); SIGTERM stops
a worker after it finished and delivered its current job, and it claims nothing more."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.tokens import create_token
from novelforge_sessions.control import handoffs
from novelforge_sessions.control.models import ConsumeReceipt, Handoff, ResultDelivery
from novelforge_sessions.lifecycles import HandoffState
from novelforge_sessions.models import Artifact

from tests.support.factories import caller_for
from tests.support.servers import ROOT
from tests.support.waits import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _jobs(project, n: int, capability: str, params=None) -> list[Handoff]:
    """n waiting handoffs (one per running session: a session waits on one handoff at a time)."""
    who = caller_for(project)
    made = []
    for i in range(n):
        s = sessions.create_session(who, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="check",
                                                             runtime_family="cli"),
                                    runtime=RuntimeSpec(runtime_family="cli", capabilities=[], lease_seconds=600))
        run = runs.start_run(who, s.id, cursor={"step": "check"})
        made.append(handoffs.create_handoff(who, run.id, logical_id=f"job-{i}", required_capabilities=[capability],
                                            params=(params or {}), timeout_seconds=60).handoff)
    return made


def _worker(server, token: str, capability: str, handler: str, name: str) -> subprocess.Popen:
    env = {**os.environ, "NOVELFORGE_URL": server.url, "NOVELFORGE_TOKEN": token, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "novelforge_client", "--json", "worker", "--capability", capability,
         "--handler", f"tests.client.handlers:{handler}", "--name", name, "--poll", "0.2"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_competing_worker_processes_run_each_handoff_exactly_once(server, project):
    _, token = create_token(project, name="workers", permissions=["read", "write", "work"])
    jobs = _jobs(project, 12, "lint")
    procs = [_worker(server, token, "lint", "make_effect", f"w{i}") for i in range(3)]
    try:
        wait_until(lambda: ConsumeReceipt.objects.count() == len(jobs), "every result consumed", timeout=90)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    delivered = [json.loads(out.strip().splitlines()[-1])["delivered"] for out, _ in outputs]
    assert sum(delivered) == len(jobs)
    for job in jobs:
        effects = Artifact.objects.filter(name__startswith=f"effect-{job.logical_id}-")
        assert effects.count() == 1, f"{job.logical_id} ran {effects.count()} times"
    assert ResultDelivery.objects.count() == len(jobs)  # each delivered once, none repeated
    assert set(Handoff.objects.values_list("state", "attempt")) == {(HandoffState.BOUND, 1)}
    assert ConsumeReceipt.objects.values("logical_id").distinct().count() == len(jobs)


def test_sigterm_finishes_and_delivers_the_current_job_then_claims_nothing(server, project, tmp_path):
    _, token = create_token(project, name="worker", permissions=["read", "write", "work"])
    release, started = tmp_path / "release", tmp_path / "started"
    jobs = _jobs(project, 2, "slow", params={"release": str(release), "started": str(started)})
    proc = _worker(server, token, "slow", "wait_for_release", "w-slow")
    try:
        wait_until(started.exists, "the first job to start", timeout=90)
        proc.send_signal(signal.SIGTERM)  # mid-job
        release.write_text("go")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["delivered"] == 1
    states = dict(Handoff.objects.values_list("logical_id", "state"))
    claimed = [lid for lid, state in states.items() if state == HandoffState.BOUND]
    assert len(claimed) == 1 and ConsumeReceipt.objects.count() == 1
    (waiting,) = [lid for lid in states if lid not in claimed]
    assert states[waiting] == HandoffState.PENDING and Handoff.objects.get(logical_id=waiting).attempt == 0
    assert Artifact.objects.filter(name__startswith="effect-").count() == 1
    assert len(jobs) == 2
