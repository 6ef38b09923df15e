"""Reviewer pages: the queue, the packet page with its generated form, CSRF, confirmation,
refusals naming the field, the relay round trip, and the session's awaiting_user wait."""
from __future__ import annotations

import json
import re
from urllib.parse import urlencode

import pytest
from django.test import Client

from novelforge_sessions.actions.runs import start_run
from novelforge_sessions.apikit.auth import caller_for_token
from novelforge_sessions.models import Event, Project
from reviews.actions import GateSpec, open_gate
from reviews.models import ReviewGate, Verdict
from tests.reviews.factories import RUBRIC, add_writer, citing, orchestrator

pytestmark = pytest.mark.django_db


def form_post(gate: ReviewGate, **over: str) -> dict[str, str]:
    data = {
        "packet_fingerprint": gate.packet.fingerprint,
        "artifact_fingerprint": gate.candidate_fingerprint,
        "decision": "revise",
        "score-clarity": "4",
        "score-pacing": "7",
        "finding-0-location": "L2",
        "finding-0-severity": "minor",
        "finding-0-note": "Between what?",
        "finding-1-location": "",
        "finding-1-severity": "",
        "finding-1-note": "",
        "confidence": "0.8",
    }
    data.update(over)
    return data


def test_pages_need_a_login(world):
    gate = world.gate()
    for url in ["/reviews/", f"/reviews/packets/{gate.packet.id}/", "/reviews/calibration/"]:
        resp = Client().get(url)
        assert resp.status_code == 302 and resp["Location"].startswith("/login/?next=")


def test_queue_lists_my_packets_oldest_first_and_nothing_about_the_project(world, as_user):
    Project.objects.filter(id=world.project.id).update(slug="lighthouse-keeper", name="The Lighthouse Keeper")
    first = world.gate(reviewers=["alice"], route="relay")
    # A second writer session of the project opens a page gate on the same draft.
    writer2, raw = add_writer(world.project)
    caller2 = caller_for_token(raw)
    start_run(orchestrator(world.project), writer2.id, frozen_inputs=citing(world.version))
    second = open_gate(caller2, writer2.id, GateSpec(candidate_version_id=world.version.id, rubric=RUBRIC, route="page",
                                                     reviewers=["bob", "alice"]))
    html = as_user("alice").get("/reviews/").content.decode()
    ids = [int(i) for i in re.findall(r'data-packet-id="(\d+)"', html)]
    assert ids == [first.packet.id, second.packet.id]
    assert "Peer-chat relay" in html and "Reviewer page" in html and "waiting for you for" in html
    assert html.count("A passage of 4 lines") == 2 and "Packet #" not in html  # what is to be read, not an id
    for secret in ("lighthouse", "Lighthouse", "chapter-01", "writer", "claude-code", "Mara"):
        assert secret not in html
    bob = as_user("bob").get("/reviews/").content.decode()
    assert re.findall(r'data-packet-id="(\d+)"', bob) == [str(second.packet.id)]
    # A cancelled gate leaves the queue.
    world.writer_api.post(f"/review-gates/{first.id}/cancel")
    html = as_user("alice").get("/reviews/").content.decode()
    assert [int(i) for i in re.findall(r'data-packet-id="(\d+)"', html)] == [second.packet.id]


def test_packet_page_shows_candidate_rubric_fingerprints_and_a_generated_form(world, as_user):
    rubric = {"criteria": [*RUBRIC["criteria"], {"key": "voice", "label": "Voice", "scale": {"min": 0, "max": 100}}]}
    gate = world.gate(rubric=rubric)
    resp = as_user("alice").get(f"/reviews/packets/{gate.packet.id}/")
    html = resp.content.decode()
    assert resp.status_code == 200
    assert '<li id="L2">Tonight it flickered twice, and Mara counted the seconds between.</li>' in html
    assert "csrfmiddlewaretoken" in html
    assert f'value="{gate.packet.fingerprint}"' in html and f'data-copy="{gate.candidate_fingerprint}"' in html
    assert gate.packet.fingerprint[:11] + "…" + gate.packet.fingerprint[-4:] in html  # short form
    assert len(re.findall(r'name="score-clarity" value="\d+"', html)) == 5
    assert len(re.findall(r'name="score-pacing" value="\d+"', html)) == 11
    assert re.search(r'<input type="number" name="score-voice" min="0" max="100"', html)
    for d in ("pass", "revise", "reject"):
        assert f'name="decision" value="{d}"' in html
    assert "Copy prompt for another chat" in html


def test_csrf_is_enforced_on_the_verdict_form(world):
    gate = world.gate()
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.users["alice"])
    resp = client.post(f"/reviews/packets/{gate.packet.id}/", form_post(gate))
    assert resp.status_code == 403
    assert Verdict.objects.count() == 0
    # In plain words for a reviewer, not Django's technical page (templates/403_csrf.html).
    html = resp.content.decode()
    assert "The form expired" in html and "Nothing was saved" in html and "CSRF" not in html


def test_an_unknown_page_is_a_plain_404_that_does_not_echo_its_address(world, as_user):
    resp = as_user("alice").get("/reviews/packets/999999/nfs_secret-ish/")
    assert resp.status_code == 404
    html = resp.content.decode()
    assert "Page not found" in html and "not a member" in html
    assert "nfs_secret" not in html and "999999" not in html


def test_form_binds_a_verdict_and_shows_the_confirmation(world, as_user):
    gate = world.gate()
    alice = as_user("alice")
    resp = alice.post(f"/reviews/packets/{gate.packet.id}/", form_post(gate))
    assert resp.status_code == 302 and resp["Location"].endswith("?bound=1#confirmation")
    v = Verdict.objects.get()
    assert (v.decision, v.scores, v.channel, v.confidence) == ("revise", {"clarity": 4, "pacing": 7}, "page", 0.8)
    assert v.findings == [{"location": "L2", "severity": "minor", "note": "Between what?"}]
    html = alice.get(resp["Location"]).content.decode()
    short = gate.packet.fingerprint[:11] + "…" + gate.packet.fingerprint[-4:]
    assert re.search(rf"Bound to <code class=\"fp\" title=\"{gate.packet.fingerprint}\">{short}</code>", html)
    assert "at <time" in html and v.bound_at.strftime("%H:%M") + " UTC" in html
    assert 'class="verdict-form"' not in html  # no second form once bound
    world.refresh()
    assert world.writer.status == "running"


@pytest.mark.parametrize(
    ("over", "field"),
    [({"score-clarity": "9"}, "scores.clarity"), ({"decision": ""}, "decision"), ({"confidence": "2"}, "confidence"),
     ({"finding-0-severity": ""}, "findings[0].severity"), ({"score-pacing": "lots"}, "scores.pacing")],
)
def test_form_refusals_name_the_field_and_keep_the_input(world, as_user, over, field):
    gate = world.gate()
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/", form_post(gate, **over))
    html = resp.content.decode()
    assert resp.status_code == 422
    assert f'<code class="field-name">{field}</code>' in html
    assert 'value="L2"' in html and "Between what?" in html  # what was typed survives
    assert Verdict.objects.count() == 0
    world.refresh()
    assert world.writer.status == "awaiting_user"


def test_form_with_stale_fingerprint_is_409(world, as_user):
    gate = world.gate()
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/",
                                 form_post(gate, packet_fingerprint="sha256:" + "9" * 64))
    assert resp.status_code == 409 and b"stale_fingerprint" in resp.content
    assert Verdict.objects.count() == 0


def test_session_awaits_the_user_while_a_relay_is_outstanding_and_runs_when_bound(world, as_user):
    gate = world.gate(route="relay", reviewers=["alice", "bob"], required_verdicts=2)
    world.refresh()
    assert world.writer.status == "awaiting_user" and world.run.state == "open"
    assert as_user("bob").post(f"/reviews/packets/{gate.packet.id}/", form_post(gate)).status_code == 302
    world.refresh()
    assert world.writer.status == "awaiting_user"  # one of two verdicts
    assert as_user("alice").post(f"/reviews/packets/{gate.packet.id}/", form_post(gate, decision="pass")).status_code == 302
    world.refresh()
    gate.refresh_from_db()
    assert world.writer.status == "running" and world.run.state == "open" and gate.outcome == "revise"
    last = Event.objects.filter(session_id=world.writer.id).order_by("-id")[:3]
    assert [e.type for e in reversed(last)] == ["review.verdict_bound", "review.gate_completed", "session.transitioned"]
    assert last[0].payload["from"] == "awaiting_user" and last[0].payload["to"] == "running"


def _section(text: str, header: str) -> str:
    return text.split(f"== {header} ==\n", 1)[1].split("\n\n== ", 1)[0]


def test_relay_round_trip(world, as_user):
    gate = world.gate(route="relay")
    alice = as_user("alice")
    exported = alice.get(f"/reviews/packets/{gate.packet.id}/relay.txt")
    assert exported.status_code == 200 and exported["Content-Type"].startswith("text/plain")
    prompt = exported.content.decode()
    page = alice.get(f"/reviews/packets/{gate.packet.id}/").content.decode()
    assert prompt.split("\n", 1)[0] in page  # the page offers the same prompt to copy

    # The other chat: reads the schema and the fingerprints from the prompt alone.
    schema = json.loads(_section(prompt, "JSON SCHEMA OF YOUR ANSWER"))
    packet_fp = re.search(r"packet_fingerprint:\s+(sha256:[0-9a-f]{64})", prompt).group(1)
    artifact_fp = re.search(r"artifact_fingerprint:\s+(sha256:[0-9a-f]{64})", prompt).group(1)
    scores_schema = schema["properties"]["scores"]
    answer = {
        "packet_fingerprint": packet_fp,
        "artifact_fingerprint": artifact_fp,
        "decision": schema["properties"]["decision"]["enum"][0],
        "scores": {k: spec["maximum"] for k, spec in scores_schema["properties"].items()},
        "findings": [{"location": "L4", "severity": schema["properties"]["findings"]["items"]["properties"]["severity"]["enum"][0],
                      "note": "A strong closing image."}],
        "confidence": 0.9,
    }
    assert set(answer) == set(schema["required"]) and set(answer["scores"]) == set(scores_schema["required"])
    world.refresh()
    assert world.writer.status == "awaiting_user"

    resp = alice.post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": json.dumps(answer, indent=2)})
    assert resp.status_code == 302
    v = Verdict.objects.get()
    assert (v.channel, v.decision, v.scores) == ("relay", "pass", {"clarity": 5, "pacing": 10})
    assert v.packet_fingerprint == gate.packet.fingerprint
    confirmation = alice.get(resp["Location"]).content.decode()
    assert "Review submitted" in confirmation and "A strong closing image." in confirmation
    assert "Read one JSON object from the whole answer (lines 1–" in confirmation
    world.refresh()
    assert world.writer.status == "running"


@pytest.mark.parametrize(
    ("answer", "status", "needle"),
    [("Sure! Here is my verdict: {", 400, "No JSON object was found"),
     ('Here it is: {"decision": "pass",}', 400, "not valid JSON (line 1, column 33"),
     ('[{"decision": "pass"}]', 400, "is a list, not a JSON object"),
     ('{"decision": "pass"}', 422, "packet_fingerprint"),
     ("", 422, "Paste the other chat"),
     ],
)
def test_relay_paste_refusals_say_what_is_wrong(world, as_user, answer, status, needle):
    gate = world.gate(route="relay")
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": answer})
    assert resp.status_code == status and needle in resp.content.decode()
    assert Verdict.objects.count() == 0


def test_relay_paste_names_a_wrong_score(world, as_user):
    gate = world.gate(route="relay")
    answer = {"packet_fingerprint": gate.packet.fingerprint, "artifact_fingerprint": gate.candidate_fingerprint,
              "decision": "pass", "scores": {"clarity": 6, "pacing": 1}, "findings": [], "confidence": 0.5}
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": json.dumps(answer)})
    assert resp.status_code == 422
    assert '<code class="field-name">scores.clarity</code> 6 is outside the scale 1..5' in resp.content.decode()


def test_the_verdict_form_refuses_a_nul_in_plain_words_and_binds_nothing(world, as_user):
    """A NUL in a finding's note reached PostgreSQL from the form (a 500 page).
    The shared validator refuses it; the form comes back with the refusal by its row, nothing bound."""
    gate = world.gate()
    events = Event.objects.count()
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/", form_post(gate, **{"finding-0-note": "Between\x00 what?"}))
    html = resp.content.decode()
    assert resp.status_code == 422
    assert "Finding 1&#x27;s note contains a character that cannot be saved (a NUL character, U+0000" in html
    assert "please remove it and submit again" in html and 'class="verdict-form"' in html
    assert Verdict.objects.count() == 0 and Event.objects.count() == events


@pytest.mark.parametrize("escape", ["\\u0000", "\\ud800"])
def test_a_relay_answer_with_unstorable_text_is_refused_in_plain_words(world, as_user, escape):
    """The other chat's reply may hold ``\\u0000`` or a lone surrogate escape: JSON allows both,
    PostgreSQL stores neither (a 500 before). Refused by its path, in plain words; nothing bound."""
    gate = world.gate(route="relay")
    events = Event.objects.count()
    answer = json.dumps({"packet_fingerprint": gate.packet.fingerprint, "artifact_fingerprint": gate.candidate_fingerprint,
                         "decision": "pass", "scores": {"clarity": 5, "pacing": 10},
                         "findings": [{"location": "L1", "severity": "minor", "note": "NOTE"}], "confidence": 0.5})
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": answer.replace("NOTE", f"odd {escape} here")})
    html = resp.content.decode()
    assert resp.status_code == 422
    assert "In the reply, finding 1&#x27;s note contains a character that cannot be saved (a NUL character" in html
    assert "Ask the other chat to answer again without it." in html
    assert '<code class="field-name">findings[0].note</code>' in html
    assert Verdict.objects.count() == 0 and Event.objects.count() == events


@pytest.mark.parametrize(
    ("over", "plain"),
    [({"score-clarity": "9" * 5000}, "Please give Clarity a whole-number score from 1 to 5."),
     ({"confidence": "1" * 5000}, "Please choose how sure you are."),
     ({"confidence": "nan"}, "Please choose how sure you are."),
     ({"finding-" + "1" * 5000 + "-location": "L1", "finding-" + "1" * 5000 + "-note": "x",
       "finding-" + "1" * 5000 + "-severity": "minor", "score-clarity": "x"}, "Please give Clarity a whole-number score"),
     ],
    ids=["score", "confidence", "nan", "finding-index"],
)
def test_the_verdict_form_names_a_number_of_thousands_of_digits(world, as_user, over, plain):
    """More than 4,300 digits raised Python's int-conversion ValueError (a 500 page).
    A number that long stays text, and the refusal names its field in plain words; nothing bound."""
    gate = world.gate()
    events = Event.objects.count()
    # Form-encoded, as a browser sends it (a 5,000-digit name is over multipart's header limit).
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/", urlencode(form_post(gate, **over)),
                                 content_type="application/x-www-form-urlencoded")
    assert resp.status_code == 422 and plain in resp.content.decode()
    assert Verdict.objects.count() == 0 and Event.objects.count() == events


def test_a_relay_answer_with_a_number_of_thousands_of_digits_is_refused_by_field(world, as_user):
    """The relay's search for the object (``raw_decode``) raised a plain ValueError
    for a 5,000-digit integer (a 500). It is now found, then refused by the API's parser by field."""
    gate = world.gate(route="relay")
    events = Event.objects.count()
    answer = ('{"packet_fingerprint": "%s", "artifact_fingerprint": "%s", "decision": "pass", '
              '"scores": {"clarity": %s, "pacing": 2}, "findings": [], "confidence": 0.5}'
              % (gate.packet.fingerprint, gate.candidate_fingerprint, "9" * 5000))
    resp = as_user("alice").post(f"/reviews/packets/{gate.packet.id}/relay/", {"answer": answer})
    html = resp.content.decode()
    assert resp.status_code == 422 and "Please give Clarity a whole-number score from 1 to 5." in html
    assert '<code class="field-name">scores.clarity</code>' in html
    assert Verdict.objects.count() == 0 and Event.objects.count() == events
