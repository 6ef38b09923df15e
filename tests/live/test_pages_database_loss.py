"""The pages when PostgreSQL is gone: a 503 page in plain words with ``Retry-After``, never the
bare "Server Error (500)" they answered before (novelforge_sessions.unavailable). The server
here points at a database that does not exist, so every query it makes fails to connect. It
connects directly; one test runs the same page through psycopg's pool, as `make run` serves, where
the 503 comes once the pool's 10 s wait for a connection runs out."""
from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest
from django.db import OperationalError
from django.test import RequestFactory

from novelforge_sessions.unavailable import server_error
from tests.support.servers import DaphneServer, database_url
from tests.live.conftest import TIMEOUT


def missing_database() -> str:
    return database_url().rsplit("/", 1)[0] + f"/nf_missing_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def server():
    missing = missing_database()
    srv = DaphneServer(extra_env={"DATABASE_URL": missing, "DB_POOL_MAX_SIZE": "0"})
    yield srv, missing.rsplit("/", 1)[1]
    srv.stop()


def fetch(opener, url: str, data: bytes | None = None, headers: dict | None = None):
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with opener.open(req, timeout=TIMEOUT) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read().decode()


def assert_unavailable_page(status, headers, body, db_name: str) -> None:
    assert status == 503, body
    assert headers["Retry-After"] == "5"
    assert headers["Content-Type"].startswith("text/html")
    assert "Temporarily unavailable" in body and "cannot reach its database" in body
    assert "Server Error" not in body
    # Nothing of the failure's own text reaches the browser.
    assert db_name not in body and "5432" not in body and "OperationalError" not in body
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]


def test_a_page_behind_a_session_cookie_answers_the_503_page(server):
    srv, db_name = server
    opener = urllib.request.build_opener()
    status, headers, body = fetch(opener, srv.url + "/", headers={"Cookie": "sessionid=" + "a" * 32})
    assert_unavailable_page(status, headers, body, db_name)
    status, headers, body = fetch(opener, srv.url + "/reviews/", headers={"Cookie": "sessionid=" + "b" * 32})
    assert_unavailable_page(status, headers, body, db_name)
    assert 'href="/reviews/"' in body  # "Try again" reloads the page asked for


def test_through_the_pool_too():
    missing = missing_database()
    srv = DaphneServer(extra_env={"DATABASE_URL": missing})  # DB_POOL_MAX_SIZE=8, as `make run`
    try:
        status, headers, body = fetch(urllib.request.build_opener(), srv.url + "/",
                                      headers={"Cookie": "sessionid=" + "c" * 32})
    finally:
        srv.stop()
    assert_unavailable_page(status, headers, body, missing.rsplit("/", 1)[1])


def test_a_login_form_sent_while_the_database_is_gone_answers_the_503_page(server):
    srv, db_name = server
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    status, _, form = fetch(opener, srv.url + "/login/")
    assert status == 200  # the form itself needs no database
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    data = urllib.parse.urlencode({"csrfmiddlewaretoken": csrf, "username": "ann", "password": "pw"}).encode()
    status, headers, body = fetch(opener, srv.url + "/login/", data=data, headers={"Referer": srv.url + "/login/"})
    assert_unavailable_page(status, headers, body, db_name)


def test_the_probes_and_the_api_say_the_same_in_their_own_terms(server):
    srv, _ = server
    opener = urllib.request.build_opener()
    assert fetch(opener, srv.url + "/healthz")[0] == 200
    status, _, body = fetch(opener, srv.url + "/readyz")
    assert (status, json.loads(body)["status"]) == (503, "unavailable")
    status, headers, body = fetch(opener, srv.url + "/api/v1/sessions", headers={"Authorization": "Bearer nf_" + "x" * 40})
    assert (status, json.loads(body)["error"]["code"]) == (503, "database_unavailable"), body
    assert headers["Retry-After"] == "1"


def test_the_handler_tells_a_database_failure_from_a_bug():
    request = RequestFactory().get("/somewhere")
    try:
        raise OperationalError("connection refused")
    except OperationalError:
        unavailable = server_error(request)
    try:
        raise ValueError("a bug")
    except ValueError:
        bug = server_error(request)
    assert (unavailable.status_code, unavailable["Retry-After"]) == (503, "5")
    assert b"Temporarily unavailable" in unavailable.content
    assert bug.status_code == 500 and not bug.has_header("Retry-After")
    assert b"Something went wrong" in bug.content and b"a bug" not in bug.content
