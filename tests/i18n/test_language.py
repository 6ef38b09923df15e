"""The pages' language (docs/pages.md#language): English by default, Simplified Chinese by the
switcher's cookie or the browser's Accept-Language; the switcher is a CSRF-protected POST to
Django's set_language; a signed-in person's choice is stored and applied again at their next
login, in any browser; the API keeps its English messages and its codes whatever the language."""
from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from novelforge_sessions.models import LanguagePreference
from tests.support.snapshots import snapshot

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery"
COOKIE = settings.LANGUAGE_COOKIE_NAME


def _html_lang(response) -> str:
    return re.search(r'<html lang="([^"]+)"', response.content.decode()).group(1)


def _csrf(client: Client, path: str = "/login/") -> str:
    page = client.get(path)
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)


@pytest.fixture
def person():
    return get_user_model().objects.create_user("writer", password=PASSWORD)


def _log_in(client: Client) -> object:
    return client.post("/login/", {"username": "writer", "password": PASSWORD,
                                   "csrfmiddlewaretoken": _csrf(client)})


def test_english_is_the_default_and_every_page_has_the_switcher():
    page = Client().get("/login/")
    html = page.content.decode()
    assert _html_lang(page) == "en"
    assert "<h1>Log in</h1>" in html and "登录" not in html
    assert 'action="/i18n/setlang/"' in html
    assert re.search(r'name="language" value="zh-hans" lang="zh-hans" aria-pressed="false">简体中文<', html)
    assert re.search(r'name="language" value="en" lang="en" aria-pressed="true">English<', html)
    missing = Client().get("/no-such-page/")
    assert missing.status_code == 404 and 'action="/i18n/setlang/"' in missing.content.decode()


def test_the_browser_language_is_followed_without_a_choice():
    page = Client(HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9,en;q=0.5").get("/login/")
    assert _html_lang(page) == "zh-hans"
    assert "<h1>登录</h1>" in page.content.decode()
    assert page["Content-Language"] == "zh-hans"


def test_the_switcher_sets_the_cookie_and_returns_to_the_page():
    client = Client(enforce_csrf_checks=True)
    response = client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/login/?next=/",
                                              "csrfmiddlewaretoken": _csrf(client)})
    assert response.status_code == 302 and response["Location"] == "/login/?next=/"
    assert response.cookies[COOKIE].value == "zh-hans"
    assert "<h1>登录</h1>" in client.get("/login/").content.decode()
    # the chosen language wins over the browser's
    english_browser = Client(HTTP_ACCEPT_LANGUAGE="en")
    english_browser.cookies[COOKIE] = "zh-hans"
    assert _html_lang(english_browser.get("/login/")) == "zh-hans"


def test_the_switcher_refuses_a_post_without_csrf_and_stores_nothing(person):
    client = Client(enforce_csrf_checks=True)
    client.force_login(person)
    before = snapshot(only=["novelforge_sessions.LanguagePreference"])
    response = client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/"})
    assert response.status_code == 403
    assert COOKIE not in response.cookies
    before.assert_unchanged()


def test_the_switcher_refuses_get_and_an_unknown_language(person):
    client = Client()
    client.force_login(person)
    assert client.get("/i18n/setlang/?language=zh-hans").status_code == 405
    response = client.post("/i18n/setlang/", {"language": "fr", "next": "/login/"})
    assert response.status_code == 302 and COOKIE not in response.cookies
    assert not LanguagePreference.objects.exists()


def test_an_unsafe_next_is_not_followed():
    response = Client().post("/i18n/setlang/", {"language": "zh-hans", "next": "https://evil.example/"})
    assert response.status_code == 302 and "evil.example" not in response["Location"]


def test_a_signed_in_choice_is_stored_and_applied_at_the_next_login_elsewhere(person):
    first = Client()
    assert _log_in(first).status_code == 302
    first.post("/i18n/setlang/", {"language": "zh-hans", "next": "/login/"})
    assert LanguagePreference.objects.get(user=person).language == "zh-hans"

    other_browser = Client()  # no cookie, an English browser
    assert _html_lang(other_browser.get("/login/")) == "en"
    response = _log_in(other_browser)
    assert response.status_code == 302
    assert response.cookies[COOKIE].value == "zh-hans"
    assert _html_lang(other_browser.get("/login/")) == "zh-hans"

    # back to English: stored as well
    other_browser.post("/i18n/setlang/", {"language": "en", "next": "/login/"})
    assert LanguagePreference.objects.get(user=person).language == "en"
    third = Client(HTTP_ACCEPT_LANGUAGE="zh-CN")
    assert _log_in(third).cookies[COOKIE].value == "en"
    assert _html_lang(third.get("/login/")) == "en"


def test_a_login_without_a_stored_choice_leaves_the_language_alone(person):
    client = Client(HTTP_ACCEPT_LANGUAGE="zh-CN")
    response = _log_in(client)
    assert response.status_code == 302 and COOKIE not in response.cookies
    assert not LanguagePreference.objects.exists()


def test_a_failed_login_in_chinese_explains_in_chinese(person):
    client = Client()
    client.cookies[COOKIE] = "zh-hans"
    response = client.post("/login/", {"username": "writer", "password": "wrong", "csrfmiddlewaretoken": _csrf(client)})
    assert response.status_code == 200
    assert "用户名或密码不正确" in response.content.decode()
    assert COOKIE not in response.cookies


def test_the_api_keeps_its_codes_and_english_messages_in_any_language():
    english = Client().get("/api/v1/sessions")
    chinese = Client(HTTP_ACCEPT_LANGUAGE="zh-CN", headers={"Cookie": f"{COOKIE}=zh-hans"}).get("/api/v1/sessions")
    assert english.status_code == chinese.status_code == 401
    assert english.json() == chinese.json()
    assert english.json()["error"]["code"]
    assert not re.search(r"[\u4e00-\u9fff]", chinese.content.decode())


def test_the_lean_api_path_has_no_locale_middleware():
    """The API's own path does not pay for LocaleMiddleware (settings.API_MIDDLEWARE)."""
    assert "django.middleware.locale.LocaleMiddleware" in settings.MIDDLEWARE
    assert "django.middleware.locale.LocaleMiddleware" not in settings.API_MIDDLEWARE


def test_the_scripts_strings_come_in_the_page_as_data_not_code():
    """The djangojs catalog of the page's language is a JSON data block (no extra request, nothing
    the Content-Security-Policy would have to allow); English carries none."""
    import json

    def block(client):
        html = client.get("/login/").content.decode()
        found = re.search(r'<script id="nf-i18n" type="application/json">(.*?)</script>', html, re.S)
        return json.loads(found.group(1))

    assert block(Client()) == {"catalog": {}, "plural": None}
    chinese = Client()
    chinese.cookies[COOKIE] = "zh-hans"
    data = block(chinese)
    assert data["catalog"]["copied"] == "已复制" and data["plural"] == "0"
