"""The relay finds the one JSON object in another chat's reply (reviews/relay.py; pure)."""
from __future__ import annotations

import json

import pytest

from reviews.relay import ExtractionRefused, extract_answer

ANSWER = {"decision": "pass", "scores": {"clarity": 5}, "findings": [{"location": "L1", "severity": "minor", "note": "x"}],
          "confidence": 0.9}
TEXT = json.dumps(ANSWER, indent=2)


def test_a_bare_object_is_the_whole_answer():
    got = extract_answer("\n  " + TEXT + "\n")
    assert got.value == ANSWER and got.source == "whole" and got.text == TEXT
    assert (got.first_line, got.last_line) == (2, 2 + TEXT.count("\n"))
    assert got.describe().startswith("one JSON object from the whole answer (lines 2–")


def test_a_json_fence_with_prose_around_it():
    reply = f"Here is my review of the chapter.\n\n```json\n{TEXT}\n```\n\nLet me know if you want more detail {{or not}}."
    got = extract_answer(reply)
    assert got.value == ANSWER and got.source == "fenced"
    assert got.first_line == 4 and got.last_line == 4 + TEXT.count("\n")
    assert "the ```json block" in got.describe()


def test_an_unlabelled_fence_and_an_unclosed_fence():
    assert extract_answer(f"```\n{TEXT}\n```").source == "fenced"
    assert extract_answer(f"Answer:\n```json\n{TEXT}\n").source == "fenced"


def test_an_object_in_prose():
    got = extract_answer(f'My verdict is {json.dumps(ANSWER)} — hope that helps.')
    assert got.value == ANSWER and got.source == "prose" and got.first_line == got.last_line == 1


def test_nested_objects_are_not_counted_separately():
    """The answer's own ``scores`` and findings are objects too: one answer, not three."""
    assert extract_answer(f"Verdict:\n{TEXT}").value == ANSWER


def test_braces_in_prose_are_just_text():
    got = extract_answer("I'd keep the {curly} style, and {this one} too. " + json.dumps(ANSWER))
    assert got.value == ANSWER and got.source == "prose"


def test_two_objects_are_refused_naming_how_many_and_where():
    reply = f"First try:\n```json\n{json.dumps(ANSWER)}\n```\nActually, better:\n```json\n{json.dumps({**ANSWER, 'decision': 'revise'})}\n```"
    with pytest.raises(ExtractionRefused) as exc:
        extract_answer(reply)
    assert exc.value.reason == "several_json_objects"
    assert "contains 2 JSON objects (starting on lines 3, 7)" in exc.value.message
    assert exc.value.details == {"objects": 2, "broken": 0, "lines": [3, 7]}


def test_no_object_is_refused():
    for reply in ["", "I think the chapter is good, pass.", "Sure! Here is my verdict: {", "{curly} words only"]:
        with pytest.raises(ExtractionRefused) as exc:
            extract_answer(reply)
        assert exc.value.reason == "no_json_object", reply
        assert exc.value.message.startswith("No JSON object was found")


def test_a_broken_object_is_refused_with_its_position_not_replaced_by_an_inner_one():
    """`{"a": {...},}` is broken; its valid inner `scores` object must not pass for the answer."""
    broken = '```json\n{"decision": "pass", "scores": {"clarity": 5},}\n```'
    with pytest.raises(ExtractionRefused) as exc:
        extract_answer(broken)
    assert exc.value.reason == "invalid_json"
    assert "line 2, column 47" in exc.value.message and exc.value.details == {"line": 2, "column": 47}


def test_one_good_and_one_broken_object_is_several():
    with pytest.raises(ExtractionRefused) as exc:
        extract_answer(f'{json.dumps(ANSWER)}\nor maybe {{"decision": "revise",}}')
    assert exc.value.reason == "several_json_objects"
    assert "1 JSON object and 1 that is not valid JSON" in exc.value.message


def test_a_list_or_a_scalar_is_not_an_object():
    for reply, kind in [(json.dumps([ANSWER]), "a list"), ('"pass"', "a single value"), ("42", "a single value")]:
        with pytest.raises(ExtractionRefused) as exc:
            extract_answer(reply)
        assert exc.value.reason == "not_an_object" and kind in exc.value.message


def test_nan_is_left_for_the_api_parser_to_name():
    """Extraction finds the object's extent; the view parses the text with loads_json, which
    refuses NaN by field (tests/reviews/test_pages.py)."""
    got = extract_answer('```json\n{"confidence": NaN}\n```')
    assert got.text == '{"confidence": NaN}'


def test_absurd_nesting_is_refused_not_crashed():
    with pytest.raises(ExtractionRefused) as exc:
        extract_answer('{"a":' * 5000 + "1" + "}" * 5000)
    assert exc.value.reason == "invalid_json"


def test_an_integer_of_thousands_of_digits_is_found_not_converted():
    """Python refuses to convert an integer of more than 4,300 digits with a ValueError that is not
    a JSONDecodeError (a 500 in the relay before): the search keeps it as text; the API's parser
    then refuses it by field (tests/reviews/test_pages.py)."""
    text = '{"scores": {"clarity": %s}}' % ("9" * 5000)
    got = extract_answer(f"Here you go: {text}")
    assert got.text == text and got.source == "prose" and got.value == {"scores": {"clarity": "9" * 5000}}
    with pytest.raises(ExtractionRefused) as info:
        extract_answer("9" * 5000)
    assert info.value.reason == "not_an_object"
