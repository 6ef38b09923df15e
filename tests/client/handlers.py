"""Worker-loop handlers the tests run in worker processes (``--handler tests.client.handlers:…``)."""
from __future__ import annotations

import os
import time
from pathlib import Path


def make_effect(job):
    """One observable side effect per execution: an artifact named after the job and this attempt."""
    h = job.handoff
    job.client.create_artifact(f"effect-{h.logical_id}-{job.worker}-a{h.attempt}", f"done by {job.worker}\n")
    return {"ok": True, "by": job.worker}


def wait_for_release(job):
    """Block until the file named in the job's params exists (the test's signal), then finish."""
    release = Path(job.handoff.params["release"])
    Path(job.handoff.params["started"]).write_text(str(os.getpid()))
    deadline = time.monotonic() + 60
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        time.sleep(0.05)
    return make_effect(job)
