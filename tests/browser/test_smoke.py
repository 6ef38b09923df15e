"""The browser tooling itself works: Chromium loads a page served by daphne against the test DB."""
import json

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_chromium_reads_readyz_from_daphne(server, page):
    page.goto(server.url + "/readyz")
    body = json.loads(page.inner_text("body"))
    assert body == {"status": "ok", "database": "ok"}
