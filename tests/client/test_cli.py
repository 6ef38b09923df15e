"""The ``novelforge`` CLI against a real server: human output and ``--json`` for every command, and
``tail`` following a session live through a real websocket, across a server restart, with no gap."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from novelforge_client import Client
from novelforge_client.cli import main
from novelforge_sessions.actions import runs, sessions
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.transcript import append_transcript
from novelforge_sessions.models import Event

from tests.support.factories import caller_for
from tests.support.servers import ROOT, DaphneServer, free_port

pytestmark = pytest.mark.django_db(transaction=True)


def cli(server, token, *args: str, as_json: bool = False):
    runner = CliRunner()
    argv = (["--json"] if as_json else []) + list(args)
    result = runner.invoke(main, argv, env={"NOVELFORGE_URL": server.url, "NOVELFORGE_TOKEN": token},
                           catch_exceptions=False)
    return result


def test_cli_commands_human_and_json(server, token, worker_token):
    opened = cli(server, token, "open", "--role", "writer", "--task-mode", "drafting", "--runtime-family", "cli",
                 "--attach", "--lease-seconds", "300", as_json=True)
    assert opened.exit_code == 0, opened.output
    s = json.loads(opened.output)
    assert s["runtime_id"] is not None and s["status"] == "created"
    human = cli(server, token, "open", "--role", "specialist", "--task-mode", "research", "--runtime-family", "codex")
    assert human.exit_code == 0 and human.output.startswith("session ") and "created" in human.output

    listing = cli(server, token, "sessions")
    assert listing.exit_code == 0 and "writer" in listing.output and "specialist" in listing.output
    assert [x["id"] for x in json.loads(cli(server, token, "sessions", "--role", "writer", as_json=True).output)] == [s["id"]]

    nf = Client(server.url, token)
    nf._runtimes[s["id"]] = s["runtime_id"]
    run = nf.start_run(s["id"], cursor={"step": "outline"})
    cp = cli(server, token, "checkpoint", str(run.id), "--boundary", "context_freeze", "--cursor", '{"step": "outline"}')
    assert cp.exit_code == 0 and cp.output.startswith("checkpoint ") and f"of run {run.id}" in cp.output
    bad = cli(server, token, "checkpoint", str(run.id), "--boundary", "context_freeze", "--cursor",
              '{"transcript": [{"role": "user", "content": "hi"}]}')
    assert bad.exit_code == 1 and "checkpoint_not_bounded" in bad.output

    job = nf.hand_off(run.id, "cli-job", required_capabilities=["lint"])
    lease = Client(server.url, worker_token).claim("cli", ["lint"])
    delivered = cli(server, worker_token, "deliver", str(job.id), "--fencing-token", str(lease.fencing_token),
                    "--job-fingerprint", job.job_fingerprint, "--result", '{"ok": true}')
    assert delivered.exit_code == 0 and "consumed" in delivered.output and "receipt" in delivered.output
    again = cli(server, worker_token, "deliver", str(job.id), "--fencing-token", str(lease.fencing_token),
                "--job-fingerprint", job.job_fingerprint, "--result", '{"ok": true}', as_json=True)
    assert json.loads(again.output)["outcome"] == "already_consumed"

    shown = cli(server, token, "show", str(s["id"]))
    assert shown.exit_code == 0 and f"session {s['id']}: running" in shown.output and "context_freeze" in shown.output
    assert json.loads(cli(server, token, "show", str(s["id"]), as_json=True).output)["session"]["id"] == s["id"]

    refused = cli(server, token, "resume", str(s["id"]), "--runtime-family", "cli", "--dry-run")
    assert refused.exit_code == 1 and "error: live_runtime_exists" in refused.output
    nf.end_run(run.id, "completed")
    nf.close(s["id"])
    dry = cli(server, token, "resume", str(s["id"]), "--runtime-family", "cli", "--dry-run")
    assert dry.exit_code == 0 and "OK (dry run: nothing changed)" in dry.output and "[ok  ]" in dry.output
    assert nf.session(s["id"]).generation == 1
    done = cli(server, token, "resume", str(s["id"]), "--runtime-family", "cli", as_json=True)
    report = json.loads(done.output)
    assert done.exit_code == 0 and report["ok"] and report["generation"] == 2

    missing = cli(server, token, "show", "999999")
    assert missing.exit_code == 1 and "not_found" in missing.output
    assert cli(server, "nfs_wrong", "sessions").exit_code == 1


class Tail:
    """``novelforge --json tail`` in its own process; lines collected by a reader thread."""

    def __init__(self, url: str, token: str, session_id: int) -> None:
        env = {**os.environ, "NOVELFORGE_URL": url, "NOVELFORGE_TOKEN": token, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "novelforge_client", "--json", "tail", "--session", str(session_id), "--after", "0"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: queue.Queue[dict] = queue.Queue()
        self.seen: list[int] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def until(self, event_id: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.seen or self.seen[-1] < event_id:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"tail never showed event {event_id}; saw {self.seen}"
            try:
                self.seen.append(self.lines.get(timeout=remaining)["id"])
            except queue.Empty:
                pass

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=30)
        return err


def test_tail_follows_live_and_resumes_after_a_server_restart_with_no_gap(project, token):
    port = free_port()
    env = {"SHUTDOWN_GRACE_SECONDS": "1", "LIVE_SWEEP_SECONDS": "1"}
    first = DaphneServer(port=port, extra_env=env)
    who = caller_for(project)
    s = sessions.create_session(who, sessions.NewSession(role="writer", memory_policy="bounded", task_mode="t",
                                                         runtime_family="cli"),
                                runtime=RuntimeSpec(runtime_family="cli", capabilities=[], lease_seconds=600))
    session_events = Event.objects.filter(session_id=s.id).order_by("id")
    tail = Tail(first.url, token, s.id)
    second = None
    try:
        tail.until(session_events.last().id)  # the backlog (after 0)
        runs.start_run(who, s.id, cursor={"step": "live"})  # committed while the socket is open: live
        tail.until(session_events.last().id)
        first.stop()  # SIGTERM: the server closes the socket (1012) and goes away
        for i in range(3):  # written while no server runs
            append_transcript(who, s.id, role="assistant", content=f"while down {i}")
        down_to = session_events.last().id
        second = DaphneServer(port=port, extra_env=env)  # the same address
        tail.until(down_to)  # reconnected, re-subscribed after its cursor
        append_transcript(who, s.id, role="assistant", content="after restart")
        tail.until(session_events.last().id)
    finally:
        err = tail.stop()
        if second is not None:
            second.stop()
        if first.proc.poll() is None:
            first.stop()
    expected = list(session_events.values_list("id", flat=True))
    assert tail.seen == expected, "the tail must show every event once, in order, with no gap"
    assert len(expected) >= 7  # created, attached, run started + moved, 3 while down, 1 after
    assert "Traceback" not in err

