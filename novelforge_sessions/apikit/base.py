"""The agent API's ``NinjaAPI``: django-ninja, ``/api/v1/…``, OpenAPI at ``/api/openapi.json``, docs at ``/api/docs``.

Built here without routes: every app's routers are mounted on it in one place,
:mod:`novelforge_sessions.routers` (the composition root the URLconf serves).

One error shape for everything (``{"error": {"code", "message", "details"}}``) — service
errors, validation errors, unparseable bodies, authentication failures, unknown paths and
methods, and even unexpected exceptions (logged, answered as ``internal_error``; never an
HTML 500 page).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation, TooManyFieldsSent
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, URLResolver, re_path
from django.views.decorators.csrf import csrf_exempt
from django.utils.datastructures import MultiValueDict
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from novelforge_sessions.access import confirming
from novelforge_sessions.apikit.auth import FRESH_TOKEN_ATTR, TokenAuth
from novelforge_sessions.apikit.common import require_json_media_type
from novelforge_sessions.apikit.schemas import MAX_BODY_DEPTH, loads_json, nested_deeper_than, refuse_unstorable_text
from novelforge_sessions.errors import (
    LOGGED,
    DatabaseUnavailable,
    InternalError,
    MalformedBody,
    MethodNotAllowed,
    NotFound,
    OtherHttpError,
    PayloadTooLarge,
    ServiceError,
    Unauthorized,
    ValidationFailed,
    for_status,
)

log = logging.getLogger("novelforge.api")


@csrf_exempt  # as ninja's own views: a POST to a wrong path is a 404, not a CSRF page
def _no_such_route(request: HttpRequest) -> HttpResponse:
    """Below /api/, a path no route serves is a 404 in the one error shape (not Django's HTML page)."""
    err = NotFound("no API route at this path", path=request.path)
    return JsonResponse(err.as_dict(), status=err.http_status)


def _in_the_error_shape(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """What ninja answers outside its exception handlers, in the one error shape: a plain-text
    405 for a method a path does not serve, and the Http404 of its root view (``/api/``).
    A recalled caller's answer stands only as ``answered_with_a_fresh_token`` says."""

    def answer(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            response = view(request, *args, **kwargs)
        except Http404:
            return _no_such_route(request)
        if response.status_code == 405 and not response.get("Content-Type", "").startswith("application/json"):
            allowed = sorted(m.strip() for m in response.get("Allow", "").split(",") if m.strip())
            err = MethodNotAllowed(f"{request.method} is not allowed here", allowed=allowed)
            json_response = JsonResponse(err.as_dict(), status=err.http_status)
            json_response["Allow"] = ", ".join(allowed)
            return json_response
        return response

    @wraps(view)  # keeps ninja's csrf_exempt marker
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        with confirming() as confirmed:
            response = answer(request, *args, **kwargs)
            if not _recalled(request):
                return response
            return answered_with_a_fresh_token(request, response, confirmed(), lambda: answer(request, *args, **kwargs))

    return wrapped


def _recalled(request: HttpRequest) -> bool:
    """Was this request answered for a recalled caller (apikit/auth.py), not checked against its token yet?"""
    return getattr(getattr(request, "auth", None), "recheck", None) is not None


def answered_with_a_fresh_token(
    request: HttpRequest, response: HttpResponse, confirmed: bool, again: Callable[[], HttpResponse],
) -> HttpResponse:
    """The answer to a recalled caller (``TokenAuth(recall=True)``), as a fresh lookup would give it.

    A success stands when the action confirmed the token in its own statement. Any refusal
    (4xx: the token changed, or the request is refused for anything, 422 included) is answered
    again from the start with the token looked up (``FRESH_TOKEN_ATTR``): a revoked token gets
    its 401, a token with other permissions or another binding gets what they allow, and
    otherwise the same refusal, now for a checked token. A refusal writes nothing, so nothing is
    repeated. A 5xx stands (the database is gone: a lookup would fail the same way). A success
    the action did not confirm means a route was given ``recall`` whose action does not check
    the token: answered as an internal error (logged), never as the success."""
    status = response.status_code
    if status < 400 and confirmed:
        return response
    if 400 <= status < 500:
        setattr(request, FRESH_TOKEN_ATTR, True)
        return again()
    if status < 400:
        log.error("%s %s: a recalled caller's success its action did not confirm (TokenAuth(recall=True) on a route "
                  "whose action does not check the token)", request.method, request.path)
        return _render(request, InternalError(LOGGED))
    return response


class _TooDeep(ValueError):
    pass


class _Parser(Parser):
    def parse_body(self, request: HttpRequest) -> Any:
        require_json_media_type(request)  # 415 for a body sent as anything but JSON
        data = loads_json(request.body)  # refuses NaN/Infinity/1e999, duplicate keys (a ServiceError: see _http_error)
        if nested_deeper_than(data, MAX_BODY_DEPTH):
            raise _TooDeep  # ninja turns any parse failure into HttpError(400): see _http_error
        return data

    def parse_querydict(self, data: MultiValueDict, list_fields: list[str], request: HttpRequest) -> dict[str, Any]:
        """Query strings too: a ``%00`` in a filter would fail in the database (bodies: ``schemas.Input``)."""
        values = super().parse_querydict(data, list_fields, request)
        refuse_unstorable_text(values, where="query")
        return values


def body_limit_doc(limit: int) -> str:
    """The body limit in words (``info.description``, every 413): one sentence, from the setting."""
    return (
        f"A request body is at most {limit} bytes as sent (`API_MAX_BODY_BYTES`, {limit / 1024:g} KiB; "
        "`x-max-body-bytes` on every request body): a larger one is `413 payload_too_large` (`details`: "
        "`limit`, `size`), whatever its fields. The field limits (`maxLength`, `maxItems`, `x-max-bytes`) bound "
        "each field; the body limit bounds them together, so a body at several fields' maxima at once can be "
        "over it (a review gate with 10 evidence items of 32 KiB)."
    )


def _declare_query_text(param: dict[str, Any], pattern: str) -> None:
    """A text query parameter refuses U+0000 (``_Parser.parse_querydict``): declared on every one."""
    def storable(node: dict[str, Any]) -> None:
        if node.get("type") == "string" and not {"pattern", "enum", "const", "format"} & set(node):
            node["pattern"] = pattern
        for option in node.get("anyOf", []):
            storable(option)
        if isinstance(node.get("items"), dict):
            storable(node["items"])

    if param.get("in") == "query":
        storable(param.get("schema", {}))


class _Api(NinjaAPI):
    def get_openapi_schema(self, **kwargs: Any) -> dict[str, Any]:
        """Declare what ``errors(...)`` cannot know per route, in one place: any operation that
        reads a JSON body answers an unparseable one with ``400 malformed_body`` (see
        ``_http_error``), one sent as another media type with ``415 unsupported_media_type``, and
        one over ``API_MAX_BODY_BYTES`` with ``413 payload_too_large`` (``bodylimit``: before any
        route runs), stated on the body as ``x-max-body-bytes``; every text query parameter
        refuses U+0000."""
        schema = super().get_openapi_schema(**kwargs)
        from novelforge_sessions.apikit.schemas import (
            STORABLE_JSON, STORABLE_JSON_MARK, STORABLE_JSON_REF, STORABLE_TEXT, X_MAX_BODY_BYTES,
        )

        def refer(node: Any) -> Any:
            if isinstance(node, dict):
                if node.get(STORABLE_JSON_MARK) is True:
                    return {"$ref": STORABLE_JSON_REF}
                return {key: refer(value) for key, value in node.items()}
            if isinstance(node, list):
                return [refer(value) for value in node]
            return node

        schema = refer(schema)
        schema.setdefault("components", {}).setdefault("schemas", {})["StorableJson"] = STORABLE_JSON
        limit = settings.API_MAX_BODY_BYTES
        schema["info"]["description"] = f"{schema['info'].get('description', '')} {body_limit_doc(limit)}".strip()
        for item in schema["paths"].values():
            for op in item.values():
                for param in op.get("parameters", []):
                    _declare_query_text(param, STORABLE_TEXT)
                if "requestBody" not in op:
                    continue
                error = op["responses"][422]["content"]
                if 400 not in op["responses"]:  # ninja keys statuses by int
                    op["responses"][400] = {"description": "Bad Request", "content": error}
                if 415 not in op["responses"]:  # require_json_media_type
                    op["responses"][415] = {"description": "Unsupported Media Type", "content": error}
                op["responses"][413] = {  # bodylimit: every /api/ body, so every operation that takes one
                    "description": f"Payload Too Large: the body is over {limit} bytes (`payload_too_large`)",
                    "content": error,
                }
                op["requestBody"][X_MAX_BODY_BYTES] = limit
        return schema

    @property
    def urls(self) -> tuple[list[URLPattern | URLResolver], str, str]:
        patterns, app_name, namespace = super().urls
        return [
            *(
                URLPattern(p.pattern, _in_the_error_shape(p.callback), p.default_args, p.name)
                if isinstance(p, URLPattern) else p
                for p in patterns
            ),
            re_path(r"", _no_such_route),  # last: only what no route above matched
        ], app_name, namespace


api = _Api(
    title="NovelForge Session Runtime API",
    version="1.0.0",
    description=(
        "Durable, resumable execution identity for supervised agent work. Every route needs a bearer "
        "token scoped to one project; objects of other projects are `404`. Errors always have the shape "
        '`{"error": {"code", "message", "details"}}`.'
    ),
    auth=TokenAuth(),
    parser=_Parser(),
    urls_namespace="api",
    docs_url="/docs",
    openapi_url="/openapi.json",
)


def _render(request: HttpRequest, exc: ServiceError) -> HttpResponse:
    return api.create_response(request, exc.as_dict(), status=exc.http_status)


@api.exception_handler(ServiceError)
def _service_error(request: HttpRequest, exc: ServiceError) -> HttpResponse:
    if not _recalled(request):  # a recalled caller's refusal is answered again: logged then
        log.info("refused %s %s: %s %s", request.method, request.path, exc.code, exc.message)
    return _render(request, exc)


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    fields = []
    for err in exc.errors:
        loc = [str(p) for p in err.get("loc", []) if p not in ("body", "payload", "query", "path")]
        fields.append({"field": ".".join(loc) or "body", "message": err.get("msg", "invalid")})
    first = fields[0]["field"] if fields else "body"
    # The first rule broken, in the message too (pydantic's words: "String should have at most 64
    # characters"; never the value itself), so that a reader of the message alone can act on it.
    message = f"invalid value for {first}: {fields[0]['message']}" if fields else "invalid value for body"
    return _render(request, ValidationFailed(message, field=first, errors=fields))


@api.exception_handler(AuthenticationError)
def _auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return _render(request, Unauthorized("a valid bearer token is required"))


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    if exc.status_code == 400 and isinstance(exc.__cause__, ServiceError):  # the parser's typed refusal
        return _render(request, exc.__cause__)
    if exc.status_code == 400 and isinstance(exc.__cause__, _TooDeep):
        return _render(request, MalformedBody(
            f"the request body nests deeper than {MAX_BODY_DEPTH} levels", max_depth=MAX_BODY_DEPTH,
        ))
    if exc.status_code == 400:
        return _render(request, MalformedBody("the request body is not valid JSON"))
    return _render(request, for_status(exc.status_code)(str(exc), status=exc.status_code))


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return _render(request, NotFound("not found"))


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return _render(request, PayloadTooLarge("the request body is too large"))


@api.exception_handler(SuspiciousOperation)
def _suspicious(request: HttpRequest, exc: SuspiciousOperation) -> HttpResponse:
    # Django refuses what it will not parse: more than DATA_UPLOAD_MAX_NUMBER_FIELDS query or
    # form fields (TooManyFieldsSent), and the like. A typed 400, as pages answer a plain 400.
    if isinstance(exc, TooManyFieldsSent):
        message = f"too many query parameters: at most {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS}"
    else:
        message = "the request was refused as malformed"
    if not _recalled(request):  # answered again: logged then
        log.warning("refused %s %s: %s", request.method, request.path, type(exc).__name__)
    return _render(request, OtherHttpError(message))


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def _database_unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
    # The connection broke (PostgreSQL restarted, the backend was terminated, the pool timed
    # out): the transaction is gone, the next request gets a fresh connection (the pool checks
    # it). A typed 503 the client retries, not a 500.
    log.warning("database unavailable on %s %s: %s", request.method, request.path, str(exc).strip()[:200])
    response = _render(request, DatabaseUnavailable("the database is unavailable; retry with the same logical ids"))
    response["Retry-After"] = "1"
    return response


@api.exception_handler(Exception)
def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    log.exception("unexpected error on %s %s", request.method, request.path)
    return _render(request, InternalError(LOGGED))
