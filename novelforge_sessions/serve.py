"""The production server: ``python -m novelforge_sessions.serve --port 8001`` (uvicorn).

``make run`` serves with daphne (Channels' own server, and ``runserver``'s under the
``daphne`` app). ``make serve-cluster``, one process per core behind one address, serves
with this: the same ASGI application under uvicorn, which the bench measured cheaper per
request (docs/performance.md#server-choice).

What this fixes that uvicorn's command line would leave to each deployment:

- **The drain.** SIGTERM: stop listening; close every websocket with 1012 (service restart:
  the dashboard reconnects and resumes after its cursor); let the HTTP requests in flight
  finish and send their responses, for at most ``SHUTDOWN_GRACE_SECONDS`` (validated as under
  daphne: ``server.drain.grace_seconds``); then cancel what is left. Uvicorn does each of these
  steps itself once ``timeout_graceful_shutdown`` is set; ``tests/live/test_graceful_shutdown.py``
  proves the same outcomes under both servers.
- **The logs.** Uvicorn's loggers are left unconfigured (``log_config=None``), so its access
  and error lines go through Django's ``LOGGING`` and its ``RedactingFilter`` like every other
  record: a token in a URL is never written in clear.
- **Exit 0 after a drain.** Uvicorn re-raises the SIGTERM it caught once it has finished; the
  handler installed here turns that into a normal exit, as daphne's, so a supervisor tells a
  completed drain (0) from a kill (137).
- **No lifespan.** Channels' router does not speak ASGI lifespan; ``lifespan="off"`` keeps
  uvicorn from probing it.
- **Where a stuck process is.** SIGUSR1 writes every thread's stack to stderr
  (``faulthandler``), so a process that does not exit after SIGTERM tells where it waits.
- **Proxy headers only from loopback** (uvicorn's default ``forwarded_allow_ips``): nginx on the
  same host (``deploy/nginx.conf``) is the only one whose ``X-Forwarded-*`` is believed.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys

APP = "novelforge_sessions.asgi:application"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m novelforge_sessions.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "novelforge_sessions.settings")
    import django

    django.setup()  # LOGGING applies before uvicorn logs anything
    import uvicorn

    from novelforge_sessions.server.drain import grace_seconds

    config = uvicorn.Config(
        APP, host=args.host, port=args.port, lifespan="off", log_config=None,
        timeout_graceful_shutdown=grace_seconds(),  # type: ignore[arg-type]  # seconds; a float works
        ws="websockets-sansio", server_header=False,
    )
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Uvicorn puts back this handler when it has drained, then raises the signal it caught again.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
