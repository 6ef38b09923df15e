"""Liveness and readiness probes, answered whatever the request's Host.

A load balancer or orchestrator probes a process by its address (``Host: 10.0.3.7:8000``),
which is not one of the names in ``ALLOWED_HOSTS``; Django's ``CommonMiddleware`` would refuse
it (400 ``DisallowedHost``). :func:`probes` (in ``MIDDLEWARE``, right after
``SecurityMiddleware``) answers ``/healthz`` and ``/readyz`` before anything validates the Host.
That is safe because nothing in a probe's answer depends on the Host (no link, no redirect:
``SECURE_REDIRECT_EXEMPT`` lists them, no cookie) and neither reads the request; every other
path still refuses an unknown Host. ``ALLOWED_HOSTS`` therefore need not list the probing IP.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.decorators import sync_and_async_middleware


def healthz(request: HttpRequest) -> JsonResponse:
    """The process answers. No dependencies are touched."""
    return JsonResponse({"status": "ok"})


def readyz(request: HttpRequest) -> JsonResponse:
    """Ready to serve: the database answers a query."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
            cur.fetchone()
    except Exception as exc:  # any DB failure means "not ready", reported, never a 500 page
        return JsonResponse({"status": "unavailable", "database": type(exc).__name__}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})


#: The probe paths (``path_info``) and their views; ``urls.py`` routes them too.
PROBES: dict[str, Callable[[HttpRequest], JsonResponse]] = {"/healthz": healthz, "/readyz": readyz}


@sync_and_async_middleware
def probes(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Middleware: a probe path is answered here, before any Host validation below it."""
    if iscoroutinefunction(get_response):
        async def answer_async(request: HttpRequest) -> HttpResponse:
            probe = PROBES.get(request.path_info)
            if probe is not None:
                return await sync_to_async(probe)(request)
            response: Awaitable[HttpResponse] = get_response(request)
            return await response

        return answer_async

    def answer(request: HttpRequest) -> HttpResponse:
        probe = PROBES.get(request.path_info)
        if probe is not None:
            return probe(request)
        return get_response(request)

    return answer
