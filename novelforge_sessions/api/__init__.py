"""The sessions' and the control plane's API routes (``/api/v1/…``), one router per resource.

They are mounted, with every other app's, in one place: :mod:`novelforge_sessions.routers`. The
API object they are mounted on, its error shape and the helpers every app's routes share (auth,
pagination, declared errors, generic schemas) are :mod:`novelforge_sessions.apikit`'s.
"""
from __future__ import annotations

from ninja import Router


def routers() -> list[Router]:
    """This app's routers, in the order their operations appear in the OpenAPI document."""
    from novelforge_sessions.api import artifacts, control, events, graphs, projects, runs, runtimes, sessions, webhooks

    return [
        projects.router, artifacts.router, sessions.router, runtimes.router, runs.router, events.router,
        *control.routers, graphs.router, webhooks.router,
    ]
