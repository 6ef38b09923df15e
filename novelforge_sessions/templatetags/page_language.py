"""The pages' script strings in the page's language (docs/pages.md#language).

``{% script_catalog %}`` renders the ``djangojs`` catalog of the current language (locale/*/LC_MESSAGES/
djangojs.po, compiled) as a JSON data block, ``<script id="nf-i18n" type="application/json">``: built
with Django's own ``JavaScriptCatalog`` (its catalog and plural rule), but in the page rather than
from a view, so the strict Content-Security-Policy needs nothing new and a page costs no extra
request. static/js reads it (``gettext``/``ngettext``/``interpolate`` of their own, a few lines).
English has no catalog: the scripts' own strings are the English text.
"""
from __future__ import annotations

from functools import lru_cache

from django import template
from django.conf import settings
from django.utils.html import json_script
from django.utils.translation import get_language
from django.utils.translation.trans_real import DjangoTranslation
from django.views.i18n import JavaScriptCatalog

register = template.Library()


@lru_cache(maxsize=16)
def catalog(language: str) -> dict:
    """The language's script messages and its plural rule, read once per process."""
    view = JavaScriptCatalog()
    view.translation = DjangoTranslation(language, domain="djangojs", localedirs=[str(p) for p in settings.LOCALE_PATHS])
    return {"catalog": view.get_catalog(), "plural": view.get_plural()}


@register.simple_tag
def script_catalog() -> str:
    return json_script(catalog(get_language() or settings.LANGUAGE_CODE), "nf-i18n")
