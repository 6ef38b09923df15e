"""The pages' language (docs/pages.md#language): Django's ``set_language`` behind the switcher in
base.html, which also stores a signed-in person's choice, and the login that applies it again.

The language of a request is LocaleMiddleware's: the ``django_language`` cookie this sets, else the
browser's ``Accept-Language``, else English. A stored choice only sets that cookie at login, so no
request pays a lookup for it.
"""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.utils.translation import check_for_language
from django.views.decorators.http import require_POST
from django.views.i18n import set_language as django_set_language

from novelforge_sessions.models import LanguagePreference

LANGUAGE_PARAMETER = "language"


def _set_cookie(response: HttpResponse, language: str) -> None:
    response.set_cookie(
        settings.LANGUAGE_COOKIE_NAME, language,
        max_age=settings.LANGUAGE_COOKIE_AGE, path=settings.LANGUAGE_COOKIE_PATH,
        domain=settings.LANGUAGE_COOKIE_DOMAIN, secure=settings.LANGUAGE_COOKIE_SECURE,
        httponly=settings.LANGUAGE_COOKIE_HTTPONLY, samesite=settings.LANGUAGE_COOKIE_SAMESITE,
    )


def _supported(language: str | None) -> bool:
    return bool(language) and language in dict(settings.LANGUAGES) and check_for_language(language)


@require_POST
def set_language(request: HttpRequest) -> HttpResponse:
    """Django's view (CSRF-checked POST, a safe ``next``, the cookie); for a signed-in person the
    choice is kept too, so their next login in any browser opens in it. A language the pages are not
    offered in (settings.LANGUAGES) only returns to the page."""
    language = request.POST.get(LANGUAGE_PARAMETER)
    if not _supported(language):
        request.POST = request.POST.copy()
        request.POST.pop(LANGUAGE_PARAMETER, None)
    response = django_set_language(request)
    if _supported(language) and request.user.is_authenticated:
        LanguagePreference.objects.update_or_create(user=request.user, defaults={"language": language})
    return response


class LoginView(auth_views.LoginView):
    """Django's login; the person's stored language, if any, becomes the browser's cookie, so the
    page after the login is in it."""

    def form_valid(self, form):
        response = super().form_valid(form)
        stored = (LanguagePreference.objects.filter(user=form.get_user())
                  .values_list("language", flat=True).first())
        if _supported(stored):
            _set_cookie(response, stored)
        return response
