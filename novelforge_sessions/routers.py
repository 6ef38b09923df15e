"""The agent API's composition root: every app's routers, mounted under ``/v1/`` on the one API
object (:mod:`novelforge_sessions.apikit.base`), which the URLconf serves at ``/api/``.

The apps' routers never mount each other: the sessions' and control plane's
(:func:`novelforge_sessions.api.routers`) and the review app's (``reviews.api.router``) meet
here only, so no app's API imports another's.
"""
from __future__ import annotations

from novelforge_sessions import api as sessions_api
from novelforge_sessions.apikit.base import api
from reviews import api as reviews_api

for _router in (*sessions_api.routers(), reviews_api.router):
    api.add_router("/v1/", _router)

__all__ = ["api"]
