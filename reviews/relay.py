"""Finding the one JSON answer in what another chat returned (pure; no Django, no I/O).

Chats rarely answer with a bare JSON object: they wrap it in a ```json fenced block, or put a
sentence before and after it. :func:`extract_answer` scans the pasted text with the standard
library's JSON decoder (``json.JSONDecoder.raw_decode`` tried at each ``{``), not with patterns
that guess where an object ends:

* a ``{`` where decoding succeeds starts a top-level object; scanning resumes after its end, so
  objects nested inside it are never counted on their own;
* a ``{`` where decoding gets past the first member and then fails is a broken object (the
  error's line and column are kept); scanning resumes where the decoder stopped, so the valid
  pieces inside a broken object are not mistaken for the answer;
* a ``{`` the decoder rejects at once (``{braces}`` in prose) is just text.

Exactly one object and no broken one: that object is the answer (with where it was found: the
whole paste, a fenced block, or the surrounding prose). Anything else is refused with the
reason: none found, one found but not valid JSON, or several. The messages (and what an answer's
object was read from, :meth:`Extracted.describe`) are English phrases (``novelforge_sessions.phrases``),
said on the page in its own language.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from novelforge_sessions.phrases import Phrase, gettext_noop

Source = Literal["whole", "fenced", "prose"]
Reason = Literal["no_json_object", "invalid_json", "several_json_objects", "not_an_object"]


@dataclass(frozen=True)
class Extracted:
    text: str  # the object's JSON text, exactly as pasted
    value: dict[str, Any]
    source: Source
    first_line: int  # 1-based lines of the paste the object spans
    last_line: int

    def describe(self) -> Phrase:
        """What was read, and where: "one JSON object from the ```json block (lines 3–9)"."""
        lines = (Phrase(gettext_noop("line %(n)s"), n=self.first_line) if self.first_line == self.last_line
                 else Phrase(gettext_noop("lines %(n)s"), n=f"{self.first_line}–{self.last_line}"))
        return Phrase(gettext_noop("one JSON object from %(where)s (%(lines)s)"), where=Phrase(WHERE[self.source]),
                      lines=lines)


#: Where the answer's object was found, in words.
WHERE: dict[str, str] = {"whole": gettext_noop("the whole answer"), "fenced": gettext_noop("the ```json block"),
                         "prose": gettext_noop("the text around it")}


class ExtractionRefused(ValueError):
    def __init__(self, reason: Reason, message: str, **details: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.details = details


#: What Python's JSON decoder says is wrong, marked for the catalogs (its other, rarer messages
#: carry the offending character and are shown as it says them).
DECODER_PROBLEMS: dict[str, str] = {
    "Expecting value": gettext_noop("Expecting value"),
    "Expecting ',' delimiter": gettext_noop("Expecting ',' delimiter"),
    "Expecting ':' delimiter": gettext_noop("Expecting ':' delimiter"),
    "Expecting property name enclosed in double quotes": gettext_noop("Expecting property name enclosed in double quotes"),
    "Unterminated string starting at": gettext_noop("Unterminated string starting at"),
    "Invalid \\uXXXX escape": gettext_noop("Invalid \\uXXXX escape"),
}


@dataclass(frozen=True)
class _Broken:
    line: int
    column: int
    msg: str


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _fenced_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the fenced code blocks (```…``` lines; an unclosed one runs to the end)."""
    spans, start, pos = [], None, 0
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            if start is None:
                start = pos + len(line)
            else:
                spans.append((start, pos))
                start = None
        pos += len(line)
    if start is not None:
        spans.append((start, len(text)))
    return spans


#: An integer literal longer than this stays text while the answer is searched: Python refuses
#: to convert one of more than 4,300 digits (a ``ValueError`` that is not a ``JSONDecodeError``),
#: and no number the service stores is anywhere near as long.
_MAX_INT_DIGITS = 400


def _integer(literal: str) -> int | str:
    return int(literal) if len(literal) <= _MAX_INT_DIGITS else literal


def _decoder() -> json.JSONDecoder:
    # NaN/Infinity and overlong integers are accepted here only to find the object's extent; the
    # caller parses the extracted text again with the API's parser, which refuses them by field name.
    return json.JSONDecoder(parse_int=_integer)


def extract_answer(text: str) -> Extracted:
    """The one JSON object in ``text`` (see the module docstring), or :class:`ExtractionRefused`."""
    decoder = _decoder()
    stripped = text.strip()
    if stripped and stripped[0] not in "{`":
        try:
            value, end = decoder.raw_decode(stripped)
        except (json.JSONDecodeError, RecursionError):
            pass
        else:
            if not stripped[end:].strip() and not isinstance(value, dict):
                raise ExtractionRefused("not_an_object", Phrase(
                    gettext_noop("The answer is a list, not a JSON object.") if isinstance(value, list)
                    else gettext_noop("The answer is a single value, not a JSON object.")))

    found: list[tuple[int, int, dict[str, Any]]] = []
    broken: list[_Broken] = []
    i = text.find("{")
    while i != -1:
        try:
            value, end = decoder.raw_decode(text, i)
        except RecursionError:
            raise ExtractionRefused(
                "invalid_json", Phrase(gettext_noop("The JSON object in the answer nests too deeply to read."))) from None
        except json.JSONDecodeError as exc:
            if exc.pos > _first_member(text, i):
                broken.append(_Broken(exc.lineno, exc.colno, exc.msg))
                i = text.find("{", max(exc.pos, i + 1))
            else:
                i = text.find("{", i + 1)
            continue
        found.append((i, end, value))
        i = text.find("{", end)

    if len(found) == 1 and not broken:
        start, end, value = found[0]
        fences = _fenced_spans(text)
        if not text[:start].strip() and not text[end:].strip():
            source: Source = "whole"
        elif any(a <= start and end <= b for a, b in fences):
            source = "fenced"
        else:
            source = "prose"
        return Extracted(text[start:end], value, source, _line_of(text, start), _line_of(text, end - 1))
    if not found and not broken:
        raise ExtractionRefused("no_json_object", Phrase(gettext_noop(
            "No JSON object was found in the answer. Ask the other chat to answer with the JSON object the prompt "
            "describes.")))
    if not found and len(broken) == 1:
        b = broken[0]
        raise ExtractionRefused(
            "invalid_json", Phrase(gettext_noop("The JSON object in the answer is not valid JSON (line %(line)s, column "
                                                "%(column)s: %(problem)s)."), line=b.line, column=b.column,
                                   problem=Phrase(DECODER_PROBLEMS[b.msg]) if b.msg in DECODER_PROBLEMS else b.msg),
            line=b.line, column=b.column)
    lines = [_line_of(text, s) for s, _, _ in found] + [b.line for b in broken]
    starts = ", ".join(str(n) for n in sorted(lines))
    objects = Phrase(gettext_noop("%(n)s JSON object") if len(found) == 1 else gettext_noop("%(n)s JSON objects"),
                     n=len(found))
    if broken:
        objects = Phrase(gettext_noop("%(objects)s and %(broken)s"), objects=objects, broken=Phrase(
            gettext_noop("%(n)s that is not valid JSON") if len(broken) == 1 else gettext_noop("%(n)s that are not valid JSON"),
            n=len(broken)))
    raise ExtractionRefused(
        "several_json_objects",
        Phrase(gettext_noop("The answer contains %(objects)s (starting on lines %(starts)s); it must contain exactly one. "
                            "Paste only the verdict object."), objects=objects, starts=starts),
        objects=len(found), broken=len(broken), lines=sorted(lines))


def _first_member(text: str, brace: int) -> int:
    """Where the decoder must get past for a failed ``{`` to count as a broken object: the
    first character after the brace and any whitespace (``{"`` got further; ``{word`` did not)."""
    j = brace + 1
    while j < len(text) and text[j] in " \t\r\n":
        j += 1
    return j
