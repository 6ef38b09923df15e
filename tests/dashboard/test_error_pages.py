"""The pages' own error pages are in plain words (templates/403.html, 404.html, 403_csrf.html,
500.html, 503.html), built on templates/_error_page.html: base.html without the user menu and
the messages, which would read the database."""
from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.template.loader import get_template
from django.test import RequestFactory
from django.views import defaults


def test_permission_denied_is_a_plain_403_page():
    request = RequestFactory().get("/admin/secret/")
    resp = defaults.permission_denied(request, PermissionDenied("internal reason"))
    html = resp.content.decode()
    assert resp.status_code == 403
    assert "Not allowed" in html and "ask a manager" in html
    assert "internal reason" not in html and "/admin/secret/" not in html


def test_the_error_pages_name_no_user_and_carry_the_stylesheet():
    for name in ("403.html", "404.html", "403_csrf.html", "500.html", "503.html"):
        html = get_template(name).render({"request": RequestFactory().get("/")})
        assert 'href="/static/css/app.css"' in html, name
        assert "Log out" not in html, name  # no user menu: rendering it would query the database
