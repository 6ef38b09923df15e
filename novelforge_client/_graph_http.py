"""Error mapping for the graph checkpointer's requests (replaced by the client core's once merged)."""
from __future__ import annotations

from typing import Any

import httpx


class ApiError(Exception):
    """A refusal in the service's one error shape: ``code``, ``status``, ``details``."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.details = status, code, message, details or {}


def raise_for_response(response: httpx.Response) -> Any:
    if response.status_code < 400:
        return response.json()
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        raise ApiError(response.status_code, "http_error", response.text[:200]) from None
    raise ApiError(response.status_code, error.get("code", "error"), error.get("message", ""), error.get("details"))
