"""Words for the manager pages (``presenters.STATE_LABELS`` / ``REASON_TEXT``, the one map).

``{{ s.status|state_label }}`` — a session state as a person reads it ("waiting for a person");
``{% with r=session.status_reason|reason %}`` — a status reason: ``r.text`` (a sentence for a
code the service writes, the free text as written otherwise), ``r.coded``, ``r.code``;
``{{ a.end_reason|reason_text }}`` — just the text;
``{% dashboard_words %}`` — the same maps as JSON (``<script id="nf-words">``) for the live
updates in static/js/dashboard.js, rendered once per page.
"""
from __future__ import annotations

from django import template
from django.utils.html import json_script

from novelforge_sessions import counting
from novelforge_sessions.dashboard import presenters

register = template.Library()


@register.filter
def state_label(value: str | None) -> str:
    return presenters.state_label(value)


@register.filter
def reason(value: str | None) -> presenters.Reason:
    return presenters.reason(value)


@register.simple_tag
def dashboard_words() -> str:
    return json_script(presenters.words(), "nf-words")


@register.filter
def reason_text(value: str | None) -> str:
    return presenters.reason_text(value)


@register.filter
def error_text(error) -> str:
    """A refusal's message in the page's language (``presenters.error_words``)."""
    return presenters.error_words(getattr(error, "code", None), getattr(error, "message", str(error)))


@register.filter
def said(value) -> str:
    """A text of the service (a validator's message, a resume step's detail) in the page's language
    (``presenters.said``)."""
    return presenters.said(value)


@register.filter
def wait_label(value: str | None) -> str:
    """A wait registry label in the page's language (``presenters.wait_words``)."""
    return presenters.wait_words(value)


@register.filter
def code_word(value: str | None) -> str:
    """A record's state code or a review decision in the page's language (``presenters.CODE_WORDS``)."""
    return presenters.code_word(value)


@register.filter
def boundary_words(value: str | None) -> str:
    """A checkpoint boundary in words (``presenters.BOUNDARY_WORDS``)."""
    return presenters.boundary_words(value)


@register.filter
def role_words(value: str | None) -> str:
    """A session's role in words (``presenters.ROLE_WORDS``)."""
    return presenters.role_words(value)


@register.filter
def memory_policy_words(value: str | None) -> str:
    """A session's memory policy in words (``presenters.MEMORY_POLICY_WORDS``)."""
    return presenters.memory_policy_words(value)


@register.filter
def event_words(value: str | None) -> str:
    """An event type in words (``presenters.EVENT_WORDS``)."""
    return presenters.event_words(value)


@register.filter
def at_most(count: int) -> str:
    """A count as a page shows it: "1000+" once it passes ``counting.COUNT_CAP``."""
    return counting.shown(count)
