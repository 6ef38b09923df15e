"""A small async agent: one session with the awaitable client, typed end to end.

    export NOVELFORGE_URL=http://127.0.0.1:8000 NOVELFORGE_TOKEN=nfs_demo_…   # make run prints it
    .venv/bin/python examples/async_agent.py

It writes a draft (an artifact), opens a writer session with runtime generation 1 kept alive by
the async runtime lease (an asyncio task heartbeats), starts a run, writes a checkpoint, walks its
runs and checkpoints with ``async for``, ends the run and closes the session. Every value is
annotated with the model the awaited call resolves to: ``python -m mypy`` (configured in
``pyproject.toml``) checks this file with the client, and ``tests/client/test_async_typing.py``
runs it in ``make test`` (and runs this example against a server).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

from novelforge_client import AsyncClient, AsyncRuntimeLease
from novelforge_client.models import (
    ArtifactOut, CheckpointOut, CloseOut, RunOut, SessionCreatedOut, SessionOut,
)


async def run_agent(url: str, token: str, *, lease: int = 30) -> int:
    tag = uuid.uuid4().hex[:8]
    async with AsyncClient(url, token) as nf:
        draft: ArtifactOut = await nf.create_artifact(f"async-example-{tag}", "The lamp answered the storm.\n")
        assert draft.current_version_id is not None and draft.current_fingerprint is not None
        s: SessionCreatedOut = await nf.create_session(
            role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="async-example",
            runtime={"runtime_family": "async-example", "lease_seconds": lease})
        assert s.runtime_id is not None  # created with runtime=: generation 1
        print(f"session {s.id}, runtime {s.runtime_id}", flush=True)

        rt: AsyncRuntimeLease
        async with nf.keep_alive(s.runtime_id) as rt:
            run: RunOut = await nf.start_run(s.id, cursor={"step": "outline"})
            cp: CheckpointOut = await nf.checkpoint(
                run.id, boundary="context_freeze", cursor={"step": "outline"},
                artifacts=[{"artifact_id": draft.id, "fingerprint": draft.current_fingerprint}])
            print(f"run {run.id}: checkpoint {cp.id} at {cp.boundary}", flush=True)
            async for each in nf.runs(s.id):
                print(f"  run {each.id} is {each.state}", flush=True)
            seqs = [c.seq async for c in nf.checkpoints(run.id)]
            done: RunOut = await nf.end_run(run.id, "completed")
            print(f"run {done.id} {done.state}; {rt.beats} heartbeat(s), checkpoints {seqs}", flush=True)
        closed: CloseOut = await nf.close(s.id, reason="async example done")
        final: SessionOut = await nf.session(s.id)
        print(f"session {final.id} is {final.status} ({closed.session.status})", flush=True)
        return 0 if final.status == closed.session.status else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("NOVELFORGE_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("NOVELFORGE_TOKEN"))
    parser.add_argument("--lease", type=int, default=30)
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("set NOVELFORGE_TOKEN (make run prints the demo token) or pass --token")
    return asyncio.run(run_agent(args.url, args.token, lease=args.lease))


if __name__ == "__main__":
    sys.exit(main())
