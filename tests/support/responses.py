"""What a test asserts of an API answer: ``ok`` (the status, then the body) and ``refused``."""
from __future__ import annotations

from typing import Any

from tests.support.snapshots import Snapshot, snapshot

_UNSET: Any = object()


def ok(resp, status: int = 200) -> Any:
    """Assert ``status`` and return the JSON body."""
    assert resp.status_code == status, resp.content
    return resp.json()


def check_error(err: dict[str, Any], code: str, *, field: str | None = None, details: dict[str, Any] = _UNSET,
                details_has: dict[str, Any] | None = None, message: str | None = None) -> dict[str, Any]:
    """Assert a typed error body: the one error shape (exactly ``code``, ``message`` and
    ``details``) and its ``code``; ``field``: ``details.field``; ``details``: the whole details
    object; ``details_has``: these keys of it; ``message``: a substring of the message.
    Returns the error."""
    assert set(err) == {"code", "message", "details"} and err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"], err
    if field is not None:
        assert err["details"]["field"] == field, err
    if details is not _UNSET:
        assert err["details"] == details, err
    for key, value in (details_has or {}).items():
        assert err["details"][key] == value, (key, err)
    if message is not None:
        assert message in err["message"], err
    return err


def refused(resp, status: int, code: str, field: str | None = None, *, unchanged: Snapshot | None = None,
            **expect: Any) -> dict[str, Any]:
    """Assert a refusal: the HTTP ``status``, the typed error ``code`` (and ``field``, ``details``,
    ``details_has``, ``message`` as ``check_error``), and, given ``unchanged`` (a ``snapshot()``
    taken before the request), that the request wrote nothing. Returns the error."""
    assert resp.status_code == status, resp.content
    body = resp.json()
    assert set(body) == {"error"}, body
    err = check_error(body["error"], code, field=field, **expect)
    if unchanged is not None:
        unchanged.assert_unchanged()
    return err


def assert_refused(call, status: int, code: str, field: str | None = None, *, before: Snapshot | None = None,
                   **expect: Any) -> dict[str, Any]:
    """Take a ``snapshot()`` (or use ``before``, taken earlier or narrowed), make the request
    ``call()``, and assert it was refused as ``refused`` says and wrote nothing. Returns the error."""
    before = before if before is not None else snapshot()
    return refused(call(), status, code, field, unchanged=before, **expect)
