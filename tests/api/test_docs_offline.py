"""``/api/docs`` works on a machine without internet: the Swagger UI page
references only this server's URLs, and its scripts and styles are served from the installed
django-ninja package through the project's static files (WhiteNoise)."""
from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.test import Client

pytestmark = pytest.mark.django_db


def _page() -> str:
    resp = Client().get("/api/docs")
    assert resp.status_code == 200
    return resp.content.decode()


def test_the_docs_page_names_no_other_host():
    html = _page()
    foreign = sorted({u for u in re.findall(r"""(?:https?:)?//[^\s"'<>]+""", html) if urlsplit(u).hostname})
    assert foreign == [], "the docs page loads assets from elsewhere (a CDN?): " + ", ".join(foreign)


def test_the_docs_assets_are_served_by_the_project():
    html = _page()
    assets = re.findall(r"""<(?:script|link)\b[^>]*?\b(?:src|href)="([^"]+)\"""", html)
    kinds = {a.rsplit(".", 1)[-1] for a in assets}
    assert {"js", "css"} <= kinds, assets
    client = Client()
    for url in assets:
        assert url.startswith(settings.STATIC_URL), url
        resp = client.get(url)
        assert resp.status_code == 200, url
        body = b"".join(resp.streaming_content) if resp.streaming else resp.content
        assert len(body) > 0, url
    # The page's settings point Swagger UI at this server's schema.
    assert '"url": "/api/openapi.json"' in html
