"""An example agent: one whole session against the demo server, so you can watch it move on the
dashboard (http://127.0.0.1:8000/, manager / manager-demo-pass).

    make run                                   # in one terminal: prints the demo API token
    export NOVELFORGE_URL=http://127.0.0.1:8000 NOVELFORGE_TOKEN=nfs_demo_…
    .venv/bin/python examples/agent.py

What it does, step by step (each step prints a line):

1. writes a chapter draft (an artifact) and opens a writer session with runtime generation 1,
   kept alive by the client's runtime lease (a background heartbeat);
2. starts a run and writes a checkpoint at the ``context_freeze`` boundary;
3. hands a continuity check off to an external worker: a worker loop (``novelforge_client.worker``)
   claims it, runs a function and delivers the result; the session waits in ``awaiting_external``
   and runs again when the result is consumed; checkpoint ``after_external_result``;
4. opens a blind review gate for the demo reviewer (``awaiting_user``); then the example plays the
   reviewer (it says so): it logs in to the reviewer pages as the demo reviewer and submits a typed
   verdict, and the agent waits for it (``--reviewer none`` leaves the verdict to you, in the browser);
5. is "killed": it stops heartbeating without detaching, as a crashed process would; the reconciler
   (``make run`` starts it) finds the lease expired and marks the session ``failed / runtime_lost``;
6. resumes: first a dry run (the report, nothing changed), then for real (runtime generation 2 and
   a new run at the saved cursor), prints the report, finishes the run and completes the session.

Options: ``--pace SECONDS`` pauses that long after each step and in each waiting state, so the
dashboard can be watched (default 0: as fast as it goes, about 7 s in all; ``--pace 5`` takes about a
minute), ``--lease SECONDS`` (default 4), ``--reviewer USER:PASSWORD`` (default the demo reviewer;
``none``: a person submits the verdict), ``--timeout SECONDS`` for each wait (default 120).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
import uuid
from typing import Any, Callable

import httpx

from novelforge_client import Client
from novelforge_client.cli import render_report
from novelforge_client.worker import Job, Worker

RUBRIC = {"criteria": [
    {"key": "clarity", "label": "Clarity", "scale": {"min": 1, "max": 5}, "description": "Can a reader follow it?"},
    {"key": "voice", "label": "Voice", "scale": {"min": 1, "max": 5}, "description": "Does the voice hold steady within the passage?"},
]}
DRAFT = ("The storm came in sideways, and the lamp answered it.\n"
         "Mara climbed the hundred and twelve steps with the logbook under her coat.\n")


def step(text: str) -> None:
    print(f"==> {text}", flush=True)


def wait_until(what: str, check: Callable[[], Any], timeout: float, poll: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def continuity_check(job: Job) -> dict[str, Any]:
    """The worker's function: a (very small) continuity check of the frozen draft."""
    version_id = job.handoff.params["version_id"]
    text = job.client.artifact_version(version_id).content
    names = sorted(set(re.findall(r"\b[A-Z][a-z]+\b", text)) - {"The"})
    return {"ok": True, "names": names}


def review_as_demo_reviewer(url: str, user: str, password: str, gate: Any) -> None:
    """The demo reviewer answers in the reviewer pages (a human reviewer has no API token): log in,
    open the blind packet, submit the typed verdict form bound to the packet's fingerprints."""
    with httpx.Client(base_url=url, follow_redirects=False, timeout=30) as web:
        web.get("/login/")
        login = web.post("/login/", data={"username": user, "password": password,
                                          "csrfmiddlewaretoken": web.cookies["csrftoken"]})
        if login.status_code != 302:
            raise SystemExit(f"the demo reviewer could not log in ({login.status_code})")
        page = web.get(f"/reviews/packets/{gate.packet_id}/")
        if page.status_code != 200:
            raise SystemExit(f"the packet page answered {page.status_code}")
        verdict = {
            "csrfmiddlewaretoken": web.cookies["csrftoken"],
            "packet_fingerprint": gate.packet_fingerprint, "artifact_fingerprint": gate.candidate_fingerprint,
            "decision": "pass", "score-clarity": "4", "score-voice": "5", "confidence": "0.8",
            "finding-0-location": "line 2", "finding-0-severity": "minor", "finding-0-note": "a hundred and twelve: check",
        }
        bound = web.post(f"/reviews/packets/{gate.packet_id}/", data=verdict)
        if bound.status_code != 302:
            raise SystemExit(f"the verdict was refused ({bound.status_code})")


def run_agent(url: str, token: str, *, lease: int = 4, reviewer: tuple[str, str] | None = ("reviewer", "reviewer-demo-pass"),
              timeout: float = 120.0, pace: float = 0.0) -> int:
    tag = uuid.uuid4().hex[:8]
    nf = Client(url, token)

    def pause(what: str) -> None:
        """With ``--pace``: hold the current state long enough to watch it on the dashboard."""
        if pace > 0:
            print(f"    (pausing {pace:g} s: {what})", flush=True)
            time.sleep(pace)

    step("1. a chapter draft, and a writer session with runtime generation 1 (heartbeating)")
    chapter = nf.create_artifact(f"example-chapter-{tag}", DRAFT, kind="chapter")
    assert chapter.current_version_id is not None  # created with its first version
    draft = nf.artifact_version(chapter.current_version_id)
    s = nf.create_session(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="example-agent",
                          provider_metadata={"example": tag},
                          runtime={"runtime_family": "example-agent", "capabilities": ["draft"], "lease_seconds": lease})
    print(f"    session {s.id}, runtime {s.runtime_id} (lease {lease} s)")
    assert s.runtime_id is not None  # created with runtime=
    rt = nf.keep_alive(s.runtime_id).__enter__()

    step("2. a run and a checkpoint at context_freeze")
    run = nf.start_run(s.id, cursor={"step": "outline", "chapter": 2}, target=chapter.name)
    ref = {"artifact_id": chapter.id, "fingerprint": draft.fingerprint}
    cp = nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": "outline", "chapter": 2}, artifacts=[ref])
    print(f"    run {run.id}, checkpoint {cp.id}")
    pause("the session is running")

    step("3. a continuity check handed off to the worker loop")
    capability = f"example-continuity-{tag}"  # only this example's worker takes it
    job = nf.hand_off(run.id, f"example-{tag}/continuity", inputs=[ref], params={"version_id": draft.id},
                      required_capabilities=[capability], timeout_seconds=60,
                      result_schema={"ok": "boolean", "names": "array"})
    print(f"    handoff {job.id} ({job.logical_id}); session {nf.session(s.id).status}")
    pause("the session waits for a worker")
    worker = Worker(Client(url, token), capabilities=[capability], handler=continuity_check,
                    name=f"example-worker-{tag}", poll_interval=0.2)
    thread = threading.Thread(target=worker.run, kwargs={"max_jobs": 1}, daemon=True)
    thread.start()
    done = wait_until("the worker's result", lambda: nf.session(s.id).status == "running"
                      and nf.handoff(job.id).state == "bound", timeout)
    thread.join(timeout)
    delivery = nf.list_deliveries(job.id).items[0]
    print(f"    {delivery.delivered_by} delivered a result ({delivery.outcome}); session running again: {bool(done)}")
    nf.advance(run.id, {"step": "review", "chapter": 2})
    nf.checkpoint(run.id, boundary="after_external_result", cursor={"step": "review", "chapter": 2}, artifacts=[ref])

    step("4. a blind review gate for the demo reviewer")
    gate = nf.open_review_gate(s.id, candidate_version_id=draft.id, rubric=RUBRIC, route="page",
                               reviewers=[reviewer[0] if reviewer else "reviewer"])
    print(f"    gate {gate.id}, packet {gate.packet_id}; session {nf.session(s.id).status}")
    pause("the session waits for a person")
    if reviewer:
        print(f"    this example now plays the reviewer: it logs in as {reviewer[0]!r} and submits the verdict "
              "through the reviewer pages (a real reviewer would; --reviewer none leaves it to you)", flush=True)
        review_as_demo_reviewer(url, reviewer[0], reviewer[1], gate)
    else:
        print(f"    waiting for a person's verdict: log in as the reviewer at {url}/reviews/", flush=True)
    gate = nf.wait_for_verdict(gate.id, timeout=timeout, poll=0.25)
    print(f"    verdict: {gate.verdicts[0].decision} {gate.verdicts[0].scores}; gate {gate.state}; "
          f"session {nf.session(s.id).status}")
    cp = nf.checkpoint(run.id, boundary="candidate_frozen", cursor={"step": "revise", "chapter": 2}, artifacts=[ref])

    step("5. killed: the agent stops heartbeating (as a crashed process would)")
    rt.abandon()
    lost = wait_until("the reconciler to mark the session failed / runtime_lost",
                      lambda: (x := nf.session(s.id)).status == "failed" and x, timeout + lease)
    print(f"    session {lost.status} ({lost.status_reason})")
    pause("the session has failed; resume comes next")

    step("6. resume: a dry run first, then for real")
    runtime = {"runtime_family": "example-agent", "capabilities": ["draft"], "lease_seconds": lease}
    print(render_report(nf.resume(s.id, runtime, dry_run=True)))
    report = nf.resume(s.id, runtime)
    print(render_report(report))
    assert report.runtime_id is not None and report.run_id is not None  # a real resume attaches and starts a run
    with nf.keep_alive(report.runtime_id) as rt2:
        cursor = nf.run(report.run_id).cursor
        print(f"    generation {report.generation} continues at {cursor}")
        nf.advance(report.run_id, {**cursor, "step": "done"})
        nf.end_run(report.run_id, "completed", session_status="completed")
        print(f"    {rt2.beats} heartbeat(s) in generation {report.generation}")
    final = nf.session(s.id)
    print(f"==> session {final.id} is {final.status} after {final.run_count} runs and {final.generation} generations")
    return 0 if final.status == "completed" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("NOVELFORGE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("NOVELFORGE_TOKEN"))
    parser.add_argument("--lease", type=int, default=4)
    parser.add_argument("--reviewer", default="reviewer:reviewer-demo-pass")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--pace", type=float, default=0.0, metavar="SECONDS",
                        help="pause this long after each step and in each waiting state (default 0)")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("set NOVELFORGE_TOKEN (make run prints the demo token) or pass --token")
    if args.pace < 0:
        parser.error("--pace must be 0 or more seconds")
    user, _, password = args.reviewer.partition(":")
    reviewer = None if args.reviewer == "none" else (user, password)
    return run_agent(args.url, args.token, lease=args.lease, reviewer=reviewer, timeout=args.timeout, pace=args.pace)


if __name__ == "__main__":
    sys.exit(main())
