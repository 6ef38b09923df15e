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
reason: none found, one found but not valid JSON, or several.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Source = Literal["whole", "fenced", "prose"]
Reason = Literal["no_json_object", "invalid_json", "several_json_objects", "not_an_object"]


@dataclass(frozen=True)
class Extracted:
    text: str  # the object's JSON text, exactly as pasted
    value: dict[str, Any]
    source: Source
    first_line: int  # 1-based lines of the paste the object spans
    last_line: int

    def describe(self) -> str:
        where = {"whole": "the whole answer", "fenced": "the ```json block", "prose": "the text around it"}[self.source]
        lines = f"line {self.first_line}" if self.first_line == self.last_line else f"lines {self.first_line}–{self.last_line}"
        return f"one JSON object from {where} ({lines})"


class ExtractionRefused(ValueError):
    def __init__(self, reason: Reason, message: str, **details: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.details = details


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
                kind = "a list" if isinstance(value, list) else "a single value"
                raise ExtractionRefused("not_an_object", f"The answer is {kind}, not a JSON object.")

    found: list[tuple[int, int, dict[str, Any]]] = []
    broken: list[_Broken] = []
    i = text.find("{")
    while i != -1:
        try:
            value, end = decoder.raw_decode(text, i)
        except RecursionError:
            raise ExtractionRefused("invalid_json", "The JSON object in the answer nests too deeply to read.") from None
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
        raise ExtractionRefused(
            "no_json_object", "No JSON object was found in the answer. Ask the other chat to answer with the JSON object "
            "the prompt describes.")
    if not found and len(broken) == 1:
        b = broken[0]
        raise ExtractionRefused(
            "invalid_json", f"The JSON object in the answer is not valid JSON (line {b.line}, column {b.column}: {b.msg}).",
            line=b.line, column=b.column)
    lines = [_line_of(text, s) for s, _, _ in found] + [b.line for b in broken]
    starts = ", ".join(str(n) for n in sorted(lines))
    parts = [f"{len(found)} JSON object{'s' if len(found) != 1 else ''}"]
    if broken:
        parts.append(f"{len(broken)} that {'is' if len(broken) == 1 else 'are'} not valid JSON")
    raise ExtractionRefused(
        "several_json_objects",
        f"The answer contains {' and '.join(parts)} (starting on lines {starts}); it must contain exactly one. "
        "Paste only the verdict object.", objects=len(found), broken=len(broken), lines=sorted(lines))


def _first_member(text: str, brace: int) -> int:
    """Where the decoder must get past for a failed ``{`` to count as a broken object: the
    first character after the brace and any whitespace (``{"`` got further; ``{word`` did not)."""
    j = brace + 1
    while j < len(text) and text[j] in " \t\r\n":
        j += 1
    return j
