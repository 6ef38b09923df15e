"""The lean /api/v1/ path resolves each path once (``api.asgi._resolve``), without sharing or
keeping what it must not: each request gets its own match, a changed URLconf is resolved anew,
a path that resolves to nothing is not kept, and the kept paths are bounded."""
from __future__ import annotations

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import override_settings
from django.urls import Resolver404, path

from novelforge_sessions.api.asgi import RESOLVED_PATHS_MAX, ApiHandler, _resolve


def other_view(request, run_id: int) -> HttpResponse:  # the URLconf below: not the API's view
    return HttpResponse(str(run_id))


urlpatterns = [path("api/v1/runs/<int:run_id>/checkpoints", other_view)]


def request_for(path_info: str) -> HttpRequest:
    request = HttpRequest()
    request.path = request.path_info = path_info
    return request


@pytest.fixture
def handler() -> ApiHandler:
    _resolve.cache_clear()
    return ApiHandler()


def test_the_same_path_is_resolved_once_and_each_request_gets_its_own_match(handler):
    first = handler.resolve_request(request_for("/api/v1/runs/7/checkpoints"))
    second = handler.resolve_request(request_for("/api/v1/runs/7/checkpoints"))
    assert _resolve.cache_info().hits == 1 and _resolve.cache_info().misses == 1
    assert first is not second and first.kwargs is not second.kwargs
    assert first.func is second.func and first.kwargs == second.kwargs == {"run_id": "7"}
    assert first.url_name == second.url_name and first.route == second.route
    # What one request does to its match does not reach the next one's.
    first.kwargs["run_id"] = 99
    first.kwargs["extra"] = True
    third = handler.resolve_request(request_for("/api/v1/runs/7/checkpoints"))
    assert third.kwargs == {"run_id": "7"}
    # Unpacked as Django's handler unpacks it, and set on the request as Django sets it.
    request = request_for("/api/v1/runs/8/checkpoints")
    callback, args, kwargs = handler.resolve_request(request)
    assert request.resolver_match.kwargs == kwargs == {"run_id": "8"} and callback is first.func


def test_a_changed_urlconf_is_resolved_anew(handler):
    api_view = handler.resolve_request(request_for("/api/v1/runs/7/checkpoints")).func
    with override_settings(ROOT_URLCONF=__name__):
        assert handler.resolve_request(request_for("/api/v1/runs/7/checkpoints")).func is other_view
    assert handler.resolve_request(request_for("/api/v1/runs/7/checkpoints")).func is api_view


def test_a_request_with_its_own_urlconf_is_resolved_through_it(handler):
    request = request_for("/api/v1/runs/5/checkpoints")
    request.urlconf = __name__
    assert handler.resolve_request(request).func is other_view
    assert _resolve.cache_info().currsize == 0


def test_a_path_that_resolves_to_nothing_is_not_kept(handler):
    # (Below /api/v1/ the API's own catch-all answers every path with its typed 404; the
    # handler still refuses a path no pattern matches, and does not keep the refusal.)
    for _ in range(2):
        with pytest.raises(Resolver404):
            handler.resolve_request(request_for("/no-such-prefix/at-all"))
    assert _resolve.cache_info().currsize == 0


def test_the_kept_paths_are_bounded(handler):
    for run_id in range(RESOLVED_PATHS_MAX + 50):
        handler.resolve_request(request_for(f"/api/v1/runs/{run_id}/checkpoints"))
    assert _resolve.cache_info().currsize == RESOLVED_PATHS_MAX
    # The newest are kept, the oldest dropped.
    hits = _resolve.cache_info().hits
    handler.resolve_request(request_for(f"/api/v1/runs/{RESOLVED_PATHS_MAX + 49}/checkpoints"))
    assert _resolve.cache_info().hits == hits + 1
    misses = _resolve.cache_info().misses
    handler.resolve_request(request_for("/api/v1/runs/0/checkpoints"))
    assert _resolve.cache_info().misses == misses + 1


def test_a_kept_match_holds_no_list_of_the_patterns_tried_before_it(handler):
    """Django's match lists every pattern it tried before the one that matched (a list each,
    about fifty for a path of the API): kept for every path, that was most of the objects a full
    garbage collection had to walk in a server. A kept match, and each request's copy, has none;
    what a view reads of it is as before."""
    from django.urls import get_resolver

    fresh = get_resolver().resolve("/api/v1/runs/7/checkpoints")
    assert len(fresh.tried) > 10  # what Django hands back: a list per pattern tried
    match = handler.resolve_request(request_for("/api/v1/runs/7/checkpoints"))
    kept = _resolve(get_resolver(), "/api/v1/runs/7/checkpoints")
    assert kept.tried is None and match.tried is None
    assert (match.func, match.args, match.kwargs, match.url_name, match.route) == (
        fresh.func, fresh.args, fresh.kwargs, fresh.url_name, fresh.route)
