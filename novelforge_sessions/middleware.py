"""Refuse oversized API bodies before anything reads them (typed 413, never a 500)."""
from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from novelforge_sessions.errors import PayloadTooLarge


class ApiBodyLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > settings.API_MAX_BODY_BYTES:
                err = PayloadTooLarge(
                    f"the body is {length} bytes; at most {settings.API_MAX_BODY_BYTES}",
                    size=length, limit=settings.API_MAX_BODY_BYTES,
                )
                return JsonResponse(err.as_dict(), status=err.http_status)
        return self.get_response(request)
