"""Server-side rules for reviewer pages: finding locations checked against the
candidate's lines (pure, API, form, relay), rubric score anchors (validation, API, packet,
prompt), the relay's extraction of one JSON object (fenced, in prose; several refused), plain
words on the page, and the way on after a review. Every refusal asserts nothing was bound."""
from __future__ import annotations

import json
from typing import Any

import pytest

from novelforge_sessions.actions.runs import start_run
from novelforge_sessions.apikit.auth import caller_for_token
from novelforge_sessions.models import Event
from reviews.actions import GateSpec, open_gate
from novelforge_sessions.session_runtime import InvalidPayload
from reviews.models import ReviewAssignment, ReviewGate, Verdict
from reviews.packets import build_packet, relay_prompt, sha256_fingerprint, validate_rubric
from reviews.verdicts import location_error, parse_location, validate_verdict
from tests.reviews.factories import CHAPTER, RUBRIC, add_writer, agent_reviewer, agent_verdict, citing, orchestrator, verdict_for
from tests.support.responses import refused

pytestmark = pytest.mark.django_db

ANCHORED = {"criteria": [
    {"key": "clarity", "label": "Clarity", "scale": {"min": 1, "max": 5},
     "anchors": {"1": "Confusing", "3": "Mostly clear", "5": "Crystal clear"}},
    {"key": "pacing", "label": "Pacing", "scale": {"min": 0, "max": 10}, "anchors": {"0": "Drags", "10": "Races"}},
]}


def nothing_bound(gate: ReviewGate) -> None:
    assert Verdict.objects.filter(packet=gate.packet).count() == 0
    assert not Event.objects.filter(type="review.verdict_bound", payload__gate_id=gate.id).exists()
    assert not ReviewAssignment.objects.filter(packet=gate.packet, state=ReviewAssignment.State.SUBMITTED).exists()


# ------------------------------------------------------------------ locations (pure)
@pytest.mark.parametrize(("text", "ranges"), [
    ("L3", [(3, 3)]), ("3", [(3, 3)]), ("line 3", [(3, 3)]), ("Lines 2-4", [(2, 4)]), ("L2–L4", [(2, 4)]),
    ("l2 to 4", [(2, 4)]), ("L1, L3-4", [(1, 1), (3, 4)]), ("L.2", [(2, 2)]),
])
def test_locations_that_name_lines(text, ranges):
    assert parse_location(text) == ranges


@pytest.mark.parametrize("text", ["paragraph 2", "the ending", "L", "L2,", "L2-", "-3", "L3 L4"])
def test_locations_that_name_no_lines(text):
    assert parse_location(text) is None
    assert location_error(text, 4).startswith("must name a line or range")


def test_location_against_the_candidate():
    assert location_error("L4", 4) is None and location_error("L1-4", 4) is None
    assert location_error("L99", 8) == "line 99 is not in the candidate (it has 8 lines)"
    assert location_error("L0", 8) == "line 0 is not in the candidate (it has 8 lines)"
    assert location_error("L3-9", 8) == "line 9 is not in the candidate (it has 8 lines)"
    assert location_error("L5-3", 8) == "the range 5-3 runs backwards"
    assert location_error("L2", 1) == "line 2 is not in the candidate (it has 1 line)"


def test_validate_verdict_names_the_finding_and_lists_every_error():
    rubric = validate_rubric(RUBRIC)
    body = {"packet_fingerprint": "sha256:" + "1" * 64, "artifact_fingerprint": "sha256:" + "2" * 64,
            "decision": "pass", "scores": {"clarity": 5, "pacing": 0}, "confidence": 1,
            "findings": [{"location": "L1", "severity": "minor", "note": "ok"},
                         {"location": "L99", "severity": "minor", "note": "out"},
                         {"location": "the end", "severity": "major", "note": "vague"}]}
    with pytest.raises(InvalidPayload) as exc:
        validate_verdict(body, rubric, candidate_lines=8)
    assert exc.value.details["field"] == "findings[1].location"
    assert [e["field"] for e in exc.value.details["errors"]] == ["findings[1].location", "findings[2].location"]
    assert validate_verdict(body, rubric).findings[1].location == "L99"  # no candidate at hand: not checked


# ------------------------------------------------------------------ locations (API, form, relay)
def test_api_refuses_an_out_of_range_finding_with_a_typed_422_and_binds_nothing(world):
    gate = world.gate(route="agent")
    _, api = agent_reviewer(world.project)
    assert api.post("/review-packets/claim").status_code == 200
    body = agent_verdict(gate, findings=[{"location": "L2", "severity": "minor", "note": "fine"},
                                         {"location": "L99", "severity": "major", "note": "beyond the end"}])
    err = refused(api.post(f"/review-packets/{gate.packet.id}/verdicts", body), 422, "validation_error")
    assert err["details"]["field"] == "findings[1].location"
    assert err["details"]["errors"] == [{"field": "findings[1].location",
                                         "message": "line 99 is not in the candidate (it has 4 lines)"}]
    nothing_bound(gate)
    gate.refresh_from_db()
    assert gate.state == "pending" and gate.bound_verdicts == 0
    # The same claim may still bind a correct verdict.
    body["findings"][1]["location"] = "L4"
    assert api.post(f"/review-packets/{gate.packet.id}/verdicts", body).status_code == 201


def test_form_refuses_an_out_of_range_finding_in_plain_words_and_keeps_the_input(world, as_user):
    gate = world.gate()
    post = {"packet_fingerprint": gate.packet.fingerprint, "artifact_fingerprint": gate.candidate_fingerprint,
            "decision": "revise", "score-clarity": "4", "score-pacing": "7", "confidence": "0.75",
            "finding-0-location": "L99", "finding-0-severity": "minor", "finding-0-note": "Which line?"}
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/", post)
    html = resp.content.decode()
    assert resp.status_code == 422
    assert "Finding 1: Line 99 is not in the candidate (it has 4 lines)." in html
    assert '<code class="field-name">findings[0].location</code>' in html  # under "Technical details"
    assert 'value="L99"' in html and "Which line?" in html
    nothing_bound(gate)


def test_relay_refuses_an_out_of_range_finding(world, as_user):
    gate = world.gate(route="relay")
    answer = {**verdict_for(gate), "findings": [{"location": "lines 3-12", "severity": "minor", "note": "x"}]}
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": json.dumps(answer)})
    assert resp.status_code == 422
    assert "Finding 1: Line 12 is not in the candidate (it has 4 lines)." in resp.content.decode()
    nothing_bound(gate)


# ------------------------------------------------------------------ anchors
def test_anchors_are_validated_sorted_and_kept_in_the_packet():
    rubric = validate_rubric(ANCHORED)
    assert rubric.criteria[0].anchors == ((1, "Confusing"), (3, "Mostly clear"), (5, "Crystal clear"))
    assert rubric.criteria[1].anchors_text() == "0 = Drags, 10 = Races"
    assert rubric.as_dict()["criteria"][0]["anchors"] == {"1": "Confusing", "3": "Mostly clear", "5": "Crystal clear"}
    assert validate_rubric(rubric.as_dict()) == rubric  # a stored rubric reads back the same
    packet = build_packet(candidate_content=CHAPTER, candidate_fingerprint=sha256_fingerprint(CHAPTER.encode()), rubric=rubric)
    clarity = packet.content["verdict_schema"]["properties"]["scores"]["properties"]["clarity"]
    assert clarity["description"] == "1 = Confusing, 3 = Mostly clear, 5 = Crystal clear"
    assert "- clarity (Clarity): integer from 1 to 5 [1 = Confusing, 3 = Mostly clear, 5 = Crystal clear]" in relay_prompt(
        packet.content, packet.fingerprint)


def test_a_rubric_without_anchors_keeps_its_packet_bytes():
    """Anchors are optional and absent from the stored rubric when none are given, so packets
    built before anchors existed still read back and fingerprint the same."""
    rubric = validate_rubric(RUBRIC)
    assert all("anchors" not in c for c in rubric.as_dict()["criteria"])
    assert validate_rubric({**RUBRIC, "criteria": [{**c, "anchors": {}} for c in RUBRIC["criteria"]]}) == rubric


@pytest.mark.parametrize(("anchors", "field"), [
    ({"6": "Too high"}, "rubric.criteria[0].anchors.6"),
    ({"0": "Too low"}, "rubric.criteria[0].anchors.0"),
    ({"one": "x"}, "rubric.criteria[0].anchors.one"),
    ({"2.5": "x"}, "rubric.criteria[0].anchors.2.5"),
    ({"1": ""}, "rubric.criteria[0].anchors.1"),
    ({"1": "x" * 81}, "rubric.criteria[0].anchors.1"),
    ({"1": 5}, "rubric.criteria[0].anchors.1"),
    ({"1": "a", "01": "b"}, "rubric.criteria[0].anchors.01"),
    (["Confusing", "Clear"], "rubric.criteria[0].anchors"),
    ({"9" * 300: "x"}, "rubric.criteria[0].anchors." + "9" * 20),  # an absurd key is echoed cut short
])
def test_bad_anchors_are_refused_naming_the_anchor(anchors, field):
    rubric = {"criteria": [{"key": "clarity", "label": "Clarity", "scale": {"min": 1, "max": 5}, "anchors": anchors}]}
    with pytest.raises(InvalidPayload) as exc:
        validate_rubric(rubric)
    assert exc.value.details["field"] == field


def test_api_opens_a_gate_with_anchors_and_refuses_bad_ones_writing_nothing(world):
    url = f"/sessions/{world.writer.id}/review-gates"
    base = {"candidate_version_id": world.version.id, "route": "page", "reviewers": ["alice"]}
    bad = {"criteria": [{**ANCHORED["criteria"][0], "anchors": {"9": "Off the scale"}}]}
    err = refused(world.writer_api.post(url, {**base, "rubric": bad}), 422, "validation_error")
    assert err["details"]["field"] == "rubric.criteria[0].anchors.9"
    assert not ReviewGate.objects.exists()
    resp = world.writer_api.post(url, {**base, "rubric": ANCHORED})
    assert resp.status_code == 201, resp.content
    gate = ReviewGate.objects.get(id=resp.json()["id"])
    assert gate.rubric["criteria"][0]["anchors"] == ANCHORED["criteria"][0]["anchors"]
    assert gate.packet.content["rubric"]["criteria"][1]["anchors"] == {"0": "Drags", "10": "Races"}


def test_the_openapi_document_describes_anchors(world):
    schema = world.writer_api.client.get("/api/openapi.json").json()
    criterion = schema["components"]["schemas"]["CriterionIn"]["properties"]["anchors"]
    assert "within the scale" in criterion["description"]


def test_the_form_shows_anchors_and_marks_required_fields(world, as_user):
    gate = world.gate(rubric=ANCHORED)
    html = as_user("alice").get(f"/reviews/packets/{gate.packet.id}/").content.decode()
    assert '<span class="pip-n">1</span><span class="anchor">Confusing</span>' in html
    assert '<span class="pip-n">5</span><span class="anchor">Crystal clear</span>' in html
    assert '<span class="pip-n">2</span></label>' in html  # no anchor: just the number
    assert "1 = Confusing, 3 = Mostly clear, 5 = Crystal clear" in html  # the rubric's list
    for name in ("decision", "score-clarity", "score-pacing", "confidence"):
        assert f'name="{name}" value=' in html
    assert html.count(" required>") >= 3 + 5 + 11 + 4  # every radio of each required group
    assert "novalidate" not in html
    assert "Severity.." not in html and "Severity…" not in html


# ------------------------------------------------------------------ plain words
def test_the_page_speaks_plainly(world, as_user):
    gate = world.gate()
    alice = as_user("alice")
    html = alice.get(f"/reviews/packets/{gate.packet.id}/").content.decode()
    assert "Submit review" in html and "Bind verdict" not in html
    assert "How to review" in html
    # The AI's instructions are in the relay prompt only, not addressed to the person.
    assert "Cite the packet fingerprint" in html.split('id="relay-prompt"', 1)[1]
    assert "Cite the packet fingerprint" not in html.split('id="relay-prompt"', 1)[0]
    # Fingerprints: still submitted, shown only inside a closed details element.
    assert f'name="packet_fingerprint" value="{gate.packet.fingerprint}"' in html
    head = html.split('<div class="review-layout">', 1)[0]
    assert gate.packet.fingerprint not in head
    assert '<details class="card tech fingerprints" id="fingerprints">' in html
    # A refusal in plain words; the code and field name only in the technical details.
    post = {"packet_fingerprint": gate.packet.fingerprint, "artifact_fingerprint": gate.candidate_fingerprint,
            "score-pacing": "7", "score-clarity": "9"}
    resp = alice.post(f"/reviews/packets/{gate.packet.id}/", post)
    html = resp.content.decode()
    assert resp.status_code == 422
    plain = html.split('<ul class="plain">', 1)[1].split("</ul>", 1)[0]
    assert "Please choose a decision: Pass, Needs revision or Reject." in plain
    assert "Please give Clarity a whole-number score from 1 to 5." in plain
    assert "Please choose how sure you are." in plain
    assert "validation_error" not in plain and "scores.clarity" not in plain and "Not bound" not in html
    missing = alice.post(f"/reviews/packets/{gate.packet.id}/", {**post, "score-clarity": ""}).content.decode()
    assert "Please score Clarity." in missing
    nothing_bound(gate)


# ------------------------------------------------------------------ the relay's extraction (views)
def _answer(gate: ReviewGate, **over: Any) -> dict[str, Any]:
    return {**verdict_for(gate), "findings": [{"location": "L4", "severity": "minor", "note": "A strong closing image."}],
            **over}


def test_a_fenced_answer_with_prose_is_accepted_and_says_what_was_read(world, as_user):
    gate = world.gate(route="relay")
    alice = as_user("alice")
    reply = ("Here's my review of the chapter.\n\n```json\n" + json.dumps(_answer(gate), indent=2) +
             "\n```\n\nOverall it's a solid opening {with small issues}.")
    resp = alice.post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": reply})
    assert resp.status_code == 302
    assert "extracted=fenced&lines=4-" in resp["Location"]
    v = Verdict.objects.get()
    assert (v.channel, v.decision, v.findings[0]["location"]) == ("relay", "revise", "L4")
    html = alice.get(resp["Location"]).content.decode()
    assert "Read one JSON object from the ```json block (lines 4–" in html
    assert "Review submitted" in html


def test_an_answer_in_prose_is_accepted(world, as_user):
    gate = world.gate(route="relay")
    reply = "My verdict: " + json.dumps(_answer(gate)) + " Hope this helps!"
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": reply})
    assert resp.status_code == 302 and "extracted=prose&lines=1" in resp["Location"]
    assert Verdict.objects.count() == 1


def test_a_two_object_answer_is_refused_naming_the_reason(world, as_user):
    gate = world.gate(route="relay")
    reply = ("```json\n" + json.dumps(_answer(gate)) + "\n```\nOr, if you prefer:\n```json\n" +
             json.dumps(_answer(gate, decision="pass")) + "\n```")
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": reply})
    html = resp.content.decode()
    assert resp.status_code == 400
    assert "The answer contains 2 JSON objects (starting on lines 2, 6); it must contain exactly one." in html
    assert 'data-code="malformed_body"' in html and "That answer was not accepted." in html
    nothing_bound(gate)


def test_the_extracted_object_is_shown_when_it_is_refused(world, as_user):
    gate = world.gate(route="relay")
    reply = "Sure:\n```json\n" + json.dumps(_answer(gate, scores={"clarity": 6, "pacing": 1})) + "\n```"
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": reply})
    html = resp.content.decode()
    assert resp.status_code == 422
    assert "Checked one JSON object from the ```json block (line 3)." in html
    assert "Please give Clarity a whole-number score from 1 to 5." in html
    assert '<code class="field-name">scores.clarity</code> 6 is outside the scale 1..5' in html
    nothing_bound(gate)


def test_nan_in_a_fenced_answer_is_named_by_the_api_parser(world, as_user):
    gate = world.gate(route="relay")
    text = json.dumps(_answer(gate)).replace('"confidence": 0.7', '"confidence": NaN')
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": f"```json\n{text}\n```"})
    assert resp.status_code == 422 and "numbers must be finite" in resp.content.decode()
    nothing_bound(gate)


# ------------------------------------------------------------------ after a review
def test_after_a_review_the_way_back_to_the_queue_and_to_the_next_packet(world, as_user):
    first = world.gate(reviewers=["alice"])
    writer2, raw = add_writer(world.project)  # a second writer session's gate (the first one now waits)
    start_run(orchestrator(world.project), writer2.id, frozen_inputs=citing(world.version))
    second = open_gate(caller_for_token(raw), writer2.id,
                       GateSpec(candidate_version_id=world.version.id, rubric=RUBRIC, route="relay", reviewers=["alice"]))
    alice = as_user("alice")
    post = {"packet_fingerprint": first.packet.fingerprint, "artifact_fingerprint": first.candidate_fingerprint,
            "decision": "pass", "score-clarity": "5", "score-pacing": "8", "confidence": "1.0"}
    resp = alice.post(f"/reviews/packets/{first.packet.id}/", post)
    html = alice.get(resp["Location"]).content.decode()
    assert f'<a class="button primary" id="next-packet" href="/reviews/packets/{second.packet.id}/">Next packet (#{second.packet.id})</a>' in html
    assert '<a class="button" id="back-to-queue" href="/reviews/">Back to the review queue</a>' in html
    assert Verdict.objects.get().confidence == 1.0
    # The last one: no next packet, still the way back.
    answer = {**verdict_for(second), "findings": []}
    resp = alice.post(f"/reviews/packets/{second.packet.id}/relay/", {"answer": json.dumps(answer)})
    html = alice.get(resp["Location"]).content.decode()
    assert 'id="next-packet"' not in html and "No other packet is waiting for you." in html
    assert 'id="back-to-queue"' in html


def test_relay_refusals_speak_of_the_reply(world, as_user):
    """What the other chat got wrong is said so that the person can tell it: a missing field by
    name, wrong fingerprints as 'copy them from the prompt' (not 'this page is out of date')."""
    gate = world.gate(route="relay")
    alice = as_user("alice")
    url = f"/reviews/packets/{gate.packet.id}/relay/"
    missing = {k: v for k, v in _answer(gate).items() if k != "decision"}
    html = alice.post(url, {"answer": json.dumps(missing)}).content.decode()
    assert "The reply has no decision; ask the other chat to answer with every field the prompt lists." in html
    wrong_fp = _answer(gate, packet_fingerprint="sha256:" + "9" * 64)
    resp = alice.post(url, {"answer": json.dumps(wrong_fp)})
    html = resp.content.decode()
    assert resp.status_code == 409 and "does not quote this packet&#x27;s fingerprints exactly" in html
    assert "out of date" not in html.split('<ul class="plain">', 1)[1].split("</ul>", 1)[0]
    nothing_bound(gate)
