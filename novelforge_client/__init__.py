"""The NovelForge Session Runtime client: typed, sync and async, with safe retries, a runtime
lease that heartbeats in the background, a worker loop and a CLI.

    from novelforge_client import Client
    with Client("http://127.0.0.1:8000", token="nfs_…") as nf:
        s = nf.create_session(role="writer", memory_policy="bounded", task_mode="drafting",
                              runtime_family="cli", runtime={"runtime_family": "cli", "lease_seconds": 60})
        with nf.keep_alive(s.runtime_id):                 # heartbeats; detaches on exit
            run = nf.start_run(s.id, cursor={"step": "outline"})
            nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": "outline"})
            nf.end_run(run.id, "completed")

Installed with the project's ``client`` extra (``pip install 'novelforge-session-runtime[client]'``);
it imports neither Django nor the server's packages (an import-linter contract checks it).
"""
from novelforge_client import errors, models
from novelforge_client._core import RetryPolicy
from novelforge_client.client import AsyncClient, Client
from novelforge_client.errors import NovelForgeError, TransportError
from novelforge_client.runtime import AsyncRuntimeLease, RuntimeLease

__all__ = [
    "AsyncClient", "AsyncRuntimeLease", "Client", "NovelForgeError", "RetryPolicy", "RuntimeLease",
    "TransportError", "errors", "models",
]
