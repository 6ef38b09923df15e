"""The service's English texts that a page says again in its own language (novelforge_sessions/phrases.py,
docs/pages.md#language): a phrase is the English text everywhere the API, the logs and the stored data
see it, and the page's language where a page shows it; every catalogued refusal has page words of its
own, translated; the verdict validator's messages, the relay's reasons and the resume report's step
details are translated phrases."""
from __future__ import annotations

import copy
import json
import pickle
import re
from dataclasses import asdict

import pytest
from django.utils import translation
from django.utils.translation import gettext

from novelforge_sessions.control.resume import StepResult
from novelforge_sessions.dashboard import presenters
from novelforge_sessions.errors import CATALOG, page_message
from novelforge_sessions.phrases import SEMICOLONS, Phrase, joined, say
from reviews import relay
from reviews.packets import rubric_from_dict
from reviews.verdicts import validate_verdict
from novelforge_sessions.session_runtime import InvalidPayload
from tests.reviews.factories import RUBRIC

CJK = re.compile(r"[\u4e00-\u9fff]")
#: English words a translated text must not hold (field names, codes and JSON's name aside).
ENGLISH_WORD = re.compile(r"\b(?!JSON\b|L\d)[A-Za-z]{4,}\b")


def in_chinese(text: str) -> str:
    with translation.override("zh-hans"):
        return say(text, gettext)


def english_words(text: str, *allowed: str) -> list[str]:
    for word in allowed:
        text = text.replace(word, " ")
    return ENGLISH_WORD.findall(text)


# --- the phrase itself ---------------------------------------------------------------------------------
def test_a_phrase_is_its_english_text_wherever_it_goes():
    inner = Phrase("line %(n)s", n=3)
    phrase = Phrase("one JSON object from %(where)s (%(lines)s)", where=Phrase("the whole answer"), lines=inner)
    english = "one JSON object from the whole answer (line 3)"
    assert phrase == english and hash(phrase) == hash(english) and str(phrase) == english
    assert json.dumps({"message": phrase}) == json.dumps({"message": english})
    assert copy.deepcopy(phrase) is phrase
    again = pickle.loads(pickle.dumps(phrase))
    assert again == english and again.message == phrase.message and again.values["lines"].message == "line %(n)s"
    # a report deep-copied by dataclasses.asdict keeps its details whole
    detail = asdict(StepResult("load", True, phrase))["detail"]
    assert isinstance(detail, Phrase) and detail.values == phrase.values


def test_say_translates_the_message_and_every_phrase_in_it_and_leaves_other_text_alone():
    shout = {"%(a)s and %(b)s": "%(a)s & %(b)s", "cat": "CAT", "%(first)s; %(next)s": "%(first)s | %(next)s"}.get

    def fake_gettext(message: str) -> str:
        return shout(message) or message

    phrase = Phrase("%(a)s and %(b)s", a=Phrase("cat"), b="dog")
    assert phrase == "cat and dog"
    assert say(phrase, fake_gettext) == "CAT & dog"
    assert say("cat", fake_gettext) == "cat", "a plain str is shown as written, never looked up"
    assert say(None, fake_gettext) == ""
    row = joined([Phrase("cat"), "dog", Phrase("cat")], SEMICOLONS)
    assert row == "cat; dog; cat" and say(row, fake_gettext) == "CAT | dog | CAT"
    assert joined([]) == "" and joined(["one"]) == "one"


# --- every catalogued refusal has its page words ----------------------------------------------------------
@pytest.mark.parametrize("code", sorted(CATALOG))
def test_every_catalogued_refusal_has_page_words_of_its_own_in_chinese(code):
    cls = CATALOG[code]
    assert "words" in vars(cls) and cls.words.strip(), f"{cls.__name__} needs its own words (errors.py)"
    assert code in presenters.ERROR_WORDS
    chinese = in_chinese(Phrase(cls.words))
    assert chinese != cls.words and CJK.search(chinese), f"{code}: {cls.words!r} is not translated"
    # a page in Chinese says them rather than the API's English message; in English it keeps the message
    with translation.override("zh-hans"):
        assert presenters.error_words(code, "an English message of the API") == chinese
    with translation.override("en"):
        assert presenters.error_words(code, "an English message of the API") == "an English message of the API"


def test_a_phrase_of_its_own_is_said_rather_than_the_codes_words():
    message = Phrase("resolution must say how the conflict was resolved (1–200 characters)")
    with translation.override("zh-hans"):
        said = page_message("validation_error", message, gettext, english=False)
    assert said == "处理说明必须写明冲突是如何处理的（1–200 个字符）"
    assert page_message("validation_error", message, gettext, english=True) == message


# --- the validators' and the relay's messages ---------------------------------------------------------------
def refused_verdict(payload, lines: int = 4) -> InvalidPayload:
    with pytest.raises(InvalidPayload) as caught:
        validate_verdict(payload, rubric_from_dict(RUBRIC), candidate_lines=lines)
    return caught.value


BAD_VERDICTS = [
    [1, 2],
    {"packet_fingerprint": "nope", "decision": "maybe", "scores": [], "findings": {}, "confidence": 7, "extra": 1},
    {"scores": {"clarity": "x", "pacing": 11, "voice": 3}, "findings": [7] + [{}] * 60},
    {"scores": {}, "findings": [{"location": "L9", "severity": "grave", "note": "", "page": 1},
                                {"location": "L3-1", "severity": "minor", "note": "ok"},
                                {"location": "somewhere", "severity": "minor", "note": "ok"},
                                {"location": "", "severity": "minor", "note": "ok"}]},
]


@pytest.mark.parametrize("payload", BAD_VERDICTS)
def test_every_message_of_the_verdict_validator_is_a_translated_phrase(payload):
    refusal = refused_verdict(payload)
    assert isinstance(refusal.message, Phrase)
    assert CJK.search(in_chinese(refusal.message))
    for error in refusal.details["errors"]:
        message = error["message"]
        assert isinstance(message, Phrase), error
        chinese = in_chinese(message)
        codes = ("location", "severity", "note", "pass", "revise", "reject", "minor", "major", "critical")
        assert CJK.search(chinese) and not english_words(chinese, *codes), (message, chinese)


def test_a_location_past_the_candidate_reads_in_chinese():
    refusal = refused_verdict({"findings": [{"location": "L9", "severity": "minor", "note": "x"}]}, lines=1)
    [location] = [e["message"] for e in refusal.details["errors"] if e["field"] == "findings[0].location"]
    assert location == "line 9 is not in the candidate (it has 1 line)"
    assert in_chinese(location) == "第 9 行不在待审文本中（待审文本共 1 行）"


@pytest.mark.parametrize("answer", [
    "no object here", "[1, 2]", "42", 'x {"a": 1,, } y', '{"a": 1}\n{"b": 2}', '{"a": 1}\n{"b": 2,,}\n{"c": ,}',
    '{"a": ' * 3000 + "1" + "}" * 3000,
])
def test_every_relay_refusal_is_a_translated_phrase(answer):
    with pytest.raises(relay.ExtractionRefused) as caught:
        relay.extract_answer(answer)
    message = caught.value.message
    assert isinstance(message, Phrase)
    chinese = in_chinese(message)
    assert CJK.search(chinese) and not english_words(chinese), chinese


def test_what_the_relay_read_is_said_in_chinese():
    found = relay.extract_answer('Here it is:\n```json\n{"decision": "pass"}\n```')
    assert found.describe() == "one JSON object from the ```json block (line 3)"
    assert in_chinese(found.describe()) == "从```json 代码块（第 3 行）中读取的一个 JSON 对象"
