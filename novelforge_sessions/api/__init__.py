"""The agent API: django-ninja, ``/api/v1/…``, OpenAPI at ``/api/openapi.json``, docs at ``/api/docs``.

One error shape for everything (``{"error": {"code", "message", "details"}}``) — service
errors, validation errors, unparseable bodies, authentication failures and even unexpected
exceptions (logged, answered as ``internal_error``; never an HTML 500 page).
"""
from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from novelforge_sessions.api.auth import TokenAuth
from novelforge_sessions.errors import NotFound, PayloadTooLarge, ServiceError, Unauthorized, ValidationFailed

log = logging.getLogger("novelforge.api")

api = NinjaAPI(
    title="NovelForge Session Runtime API",
    version="1.0.0",
    description=(
        "Durable, resumable execution identity for supervised agent work. Every route needs a bearer "
        "token scoped to one project; objects of other projects are `404`. Errors always have the shape "
        '`{"error": {"code", "message", "details"}}`.'
    ),
    auth=TokenAuth(),
    urls_namespace="api",
    docs_url="/docs",
    openapi_url="/openapi.json",
)


def _render(request: HttpRequest, exc: ServiceError) -> HttpResponse:
    return api.create_response(request, exc.as_dict(), status=exc.http_status)


@api.exception_handler(ServiceError)
def _service_error(request: HttpRequest, exc: ServiceError) -> HttpResponse:
    log.info("refused %s %s: %s %s", request.method, request.path, exc.code, exc.message)
    return _render(request, exc)


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    fields = []
    for err in exc.errors:
        loc = [str(p) for p in err.get("loc", []) if p not in ("body", "payload", "query", "path")]
        fields.append({"field": ".".join(loc) or "body", "message": err.get("msg", "invalid")})
    first = fields[0]["field"] if fields else "body"
    return _render(request, ValidationFailed(f"invalid value for {first}", field=first, errors=fields))


@api.exception_handler(AuthenticationError)
def _auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return _render(request, Unauthorized("a valid bearer token is required"))


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    if exc.status_code == 400:
        return _render(request, ServiceError("the request body is not valid JSON", code="malformed_body", http_status=400))
    return _render(request, ServiceError(str(exc), code="http_error", http_status=exc.status_code))


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return _render(request, NotFound("not found"))


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return _render(request, PayloadTooLarge("the request body is too large"))


@api.exception_handler(Exception)
def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    log.exception("unexpected error on %s %s", request.method, request.path)
    return _render(request, ServiceError("internal error; it has been logged", code="internal_error", http_status=500))


def _register_routers() -> None:
    from novelforge_sessions.api import artifacts, events, projects, runs, runtimes, sessions

    api.add_router("/v1/", projects.router)
    api.add_router("/v1/", artifacts.router)
    api.add_router("/v1/", sessions.router)
    api.add_router("/v1/", runtimes.router)
    api.add_router("/v1/", runs.router)
    api.add_router("/v1/", events.router)

    from novelforge_sessions.api import control

    for control_router in control.routers:
        api.add_router("/v1/", control_router)

    from reviews.api import router as reviews_router

    api.add_router("/v1/", reviews_router)


_register_routers()
