"""Worker-loop handlers the tests run in worker processes (``--handler tests.client.handlers:…``)."""
from __future__ import annotations

import os
from pathlib import Path

from tests.support.waits import wait_until


def make_effect(job):
    """One observable side effect per execution: an artifact named after the job and this attempt."""
    h = job.handoff
    job.client.create_artifact(f"effect-{h.logical_id}-{job.worker}-a{h.attempt}", f"done by {job.worker}\n")
    return {"ok": True, "by": job.worker}


def wait_for_release(job):
    """Block until the file named in the job's params exists (the test's signal), then finish."""
    release = Path(job.handoff.params["release"])
    Path(job.handoff.params["started"]).write_text(str(os.getpid()))
    wait_until(release.exists, "the test to release the job", timeout=60, error=TimeoutError)
    return make_effect(job)
