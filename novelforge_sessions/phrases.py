"""English text that a page can say again in its own language (docs/pages.md#language).

The service words its refusals and reports in English: the API's messages, the verdict validator's
field messages, the relay's reasons, the resume report's step details. Those modules are pure (no
Django) or run where no language is active, and the API answers in English whatever the request
says. A page in another language still needs the same sentence in that language, so such a text is
a :class:`Phrase`: the English ``str`` itself — equal to it everywhere (JSON, logs, comparisons, the
API's bodies) — that also keeps its message, marked with :func:`gettext_noop` so ``make messages``
puts it in the catalogs, and the values put into it. A page says it again with :func:`say` and its
own ``gettext`` (``dashboard/presenters.py``, ``reviews/views.py``, the ``said`` template filter).

Values stay as they are (numbers, field names, codes), except a value that is itself a Phrase,
which is said in the same language.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def gettext_noop(message: str) -> str:
    """Mark ``message`` for the translation catalogs (``makemessages`` looks for this name) and
    return it unchanged: the text is translated later, by the page that shows it."""
    return message


class Phrase(str):
    """``message % values`` in English, remembering ``message`` and ``values`` for :func:`say`."""

    message: str
    values: Mapping[str, Any]

    def __new__(cls, message: str, /, **values: Any) -> Phrase:
        self = super().__new__(cls, message % values if values else message)
        self.message = message
        self.values = values
        return self

    # A phrase is immutable like any str: copies (dataclasses.asdict deep-copies a report) keep it whole.
    def __copy__(self) -> Phrase:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Phrase:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (self.message, dict(self.values))


def _rebuild(message: str, values: dict[str, Any]) -> Phrase:
    return Phrase(message, **values)


#: How :func:`joined` puts phrases in a row (each language has its own separators).
COMMAS = gettext_noop("%(first)s, %(next)s")
SEMICOLONS = gettext_noop("%(first)s; %(next)s")


def joined(parts: Sequence[str], message: str = COMMAS) -> str:
    """``parts`` in a row — ``", ".join(parts)`` in English — as one phrase (empty: "")."""
    if not parts:
        return ""
    out = parts[0]
    for part in parts[1:]:
        out = Phrase(message, first=out, next=part)
    return out


def say(text: Any, gettext: Callable[[str], str]) -> str:
    """``text`` in the language of ``gettext``: a Phrase's message translated with its values put
    back (a value that is a Phrase said the same way); any other text as it is."""
    if not isinstance(text, Phrase):
        return text if isinstance(text, str) else "" if text is None else str(text)
    values = {k: say(v, gettext) if isinstance(v, Phrase) else v for k, v in text.values.items()}
    translated = gettext(text.message)
    return translated % values if values else translated
