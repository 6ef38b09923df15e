"""Every code of the service's closed catalog has its typed client exception, with the same
status and the same family (a 409 is a ``Conflict``); the mapping is checked against answers of
the real server too (in test_client.py) and here on bodies."""
from __future__ import annotations

import pytest

from novelforge_client import errors as E
from novelforge_sessions.errors import CATALOG, Conflict


@pytest.mark.parametrize("code", sorted(CATALOG))
def test_every_catalog_code_maps_to_a_client_class(code):
    server_cls = CATALOG[code]
    cls = E.CODES[code]
    assert cls.__name__ == server_cls.__name__ and cls.status == server_cls.http_status
    assert issubclass(cls, E.NovelForgeError)
    assert issubclass(cls, E.Conflict) == issubclass(server_cls, Conflict)
    exc = E.error_for(server_cls.http_status, {"error": {"code": code, "message": "m", "details": {"k": 1}}})
    assert type(exc) is cls and (exc.code, exc.status, exc.message, exc.details) == (code, server_cls.http_status, "m", {"k": 1})


def test_the_client_knows_no_code_the_catalog_lacks():
    grouping = {"bad_request", "conflict", "intent_not_executable"}  # base classes, as in the server
    assert set(E.CODES) - grouping == set(CATALOG)


def test_unknown_codes_and_bodies_fall_back_by_status():
    newer = E.error_for(409, {"error": {"code": "some_new_refusal", "message": "later", "details": {}}})
    assert type(newer) is E.Conflict and newer.code == "some_new_refusal"
    assert type(E.error_for(502, "<html>bad gateway</html>")) is E.InternalError
    assert type(E.error_for(404, None)) is E.NotFound
    odd = E.error_for(418, {"error": {"code": "teapot", "message": "", "details": []}})
    assert type(odd) is E.NovelForgeError and odd.details == {} and odd.status == 418
