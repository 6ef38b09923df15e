"""Property-based fuzzing of the whole agent API against its own OpenAPI schema (schemathesis).

What it proves, for every operation in ``/api/openapi.json``:

* every schemathesis check passes with its default expectations (``"checks": {"enabled": True}``):
  bad input never yields a 5xx and is refused (negative data rejection); a request the schema
  calls valid is accepted (positive data acceptance: the schema declares the validators' limits,
  see tests/api/test_schema_limits.py), except for the few rules listed in ``CONFIG`` that depend
  on stored rows; every status the API answers is declared for that operation; content types,
  headers and bodies conform to the declared schema of their status;
* every error body has the one shape ``{"error": {"code", "message", "details"}}``.

The schema is loaded from the app in-process (WSGI, same thread and connection as the test),
so each operation's examples run inside that test's transaction and roll back at the end
(``on_commit`` broadcasts never fire, which is fine: nothing here listens).
Requests carry a real bearer token with every permission, and integer path ids are mostly
replaced by ids of real rows (a running session with a live runtime, an open run, a
checkpoint, an artifact and its versions, a handoff, a write intent, a review gate and its
packet) so generated requests reach the actions, not only the 404 branch.

Bounded and deterministic: few examples per operation, a fixed seed, derandomized generation.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import HealthCheck, settings

from novelforge_sessions.actions import artifacts, runs, sessions
from novelforge_sessions.control import checkpoints, handoffs, intents
from novelforge_sessions.actions.runtimes import RuntimeSpec
from novelforge_sessions.actions.tokens import ALL_PERMISSIONS
from novelforge_sessions.actions.transcript import append_transcript
from novelforge_sessions.models import ApiToken, Project, Session
from novelforge_sessions.lifecycles import DeliveryState
from novelforge_sessions.webhooks import endpoints as webhook_endpoints
from novelforge_sessions.webhooks.models import WebhookDelivery
from reviews import actions as review_actions
from tests.support.factories import caller_for, make_project

# Fixed raw tokens (only their hashes are stored, per test): the auth provider below can then
# hand them to schemathesis, which leaves them off when it tests a missing/garbled credential.
OWNER_TOKEN = "nfs_fuzz-owner-0000000000000000000000000000000"
REVIEWER_TOKEN = "nfs_fuzz-reviewer-00000000000000000000000000000"

# CI runs a fixed seed with few examples; a deeper local hunt: FUZZ_EXAMPLES=200 FUZZ_SEED=7 pytest tests/api/test_fuzz.py
CONFIG = schemathesis.Config.from_dict({
    "seed": int(os.environ.get("FUZZ_SEED", "20240601")),
    # deterministic: derandomized generation; no example database, so runs never replay each other's finds.
    "generation": {
        "max-examples": int(os.environ.get("FUZZ_EXAMPLES", "15")), "deterministic": True, "database": "none",
    },
    # Every check schemathesis has, with its default expectations: a request the schema calls
    # valid must not be refused (positive_data_acceptance), one it calls invalid must be
    # (negative_data_rejection), statuses, content types, headers and bodies as declared.
    "checks": {"enabled": True},
    # The only exceptions: rules no JSON Schema can state, because they depend on stored rows
    # (a 422 naming the field is the declared answer there; a 400 or 5xx still fails):
    "operations": [
        {"include-name": name, "checks": {"positive_data_acceptance": {
            "expected-statuses": ["2xx", "3xx", "401", "403", "404", "409", "429", "422"]}}}
        for name in (
            # the result must match the frozen job's own result_schema; result_hash must equal the
            # server's sha256 of that result
            "POST /api/v1/handoffs/{handoff_id}/results",
            # the frozen inputs must cite current versions of this project's artifacts; a full JSON
            # Schema as result_schema must be a valid Draft 2020-12 schema (checked by jsonschema)
            "POST /api/v1/runs/{run_id}/handoffs",
            # the versions a settlement or make_current cites must exist in this project
            "POST /api/v1/write-intents",
            # the scores must follow the packet's rubric (its criteria and scales)
            "POST /api/v1/review-packets/{packet_id}/verdicts",
            # pending handoffs/gates and approvals are resolved against this session's rows; the
            # whole checkpoint is bounded in bytes and refused when it carries a transcript's shape
            "POST /api/v1/runs/{run_id}/checkpoints",
            # a graph checkpoint is one bounded checkpoint of the thread's run (the same byte and
            # transcript-shape bounds), its blobs' versions must match the channel versions it names
            "POST /api/v1/graph-threads/checkpoints",
            # a graph write may name its value by the fingerprint of a blob the project holds
            "POST /api/v1/graph-threads/writes",
            # an uploaded blob's chunks must hash to the fingerprint they name (index < count: two fields)
            "POST /api/v1/graph-blobs",
            # a batch's checkpoints carry the same stored-row refs and bounds as single checkpoints
            "POST /api/v1/runs/{run_id}/batch",
            # the metadata filter is a JSON object carried in a query string: OpenAPI parameters
            # declare its type as a string, not the JSON inside it
            "GET /api/v1/graph-threads/checkpoints",
            # a rubric scale needs min < max and max - min <= MAX_SCALE_SPAN (comparisons of two fields,
            # stated in ScaleIn's description), anchor keys within the scale, criterion keys are
            # unique by key, a page gate's required_verdicts at most its reviewers and an agent gate's
            # at least its reviewer sessions, reviewers must hold the reviewer role in this project
            "POST /api/v1/sessions/{session_id}/review-gates",
            # artifact_id is required for kind artifact.make_current: a dependency between two query
            # parameters, which OpenAPI 3.1 parameters cannot express (a body can: WriteIntentIn)
            "GET /api/v1/write-intents/before-state",
            # a transcript entry is bounded in UTF-8 bytes (x-max-bytes, which schemathesis does not
            # read); JSON Schema counts characters, so its maxLength is the bound in characters and a
            # shorter multi-byte entry can still be over it
            "POST /api/v1/sessions/{session_id}/transcript",
            # a webhook URL's host must resolve, and only to public addresses (docs/webhooks.md#private-addresses)
            "POST /api/v1/webhooks",
        )
    ],
})

schema = schemathesis.openapi.from_wsgi("/api/openapi.json", get_wsgi_application(), config=CONFIG)


@schema.auth(refresh_interval=None)
class FuzzTokens:
    """Owner token everywhere; the reviewer's session-bound token on the reviewer's packet routes."""

    def get(self, case: schemathesis.Case, context: schemathesis.AuthContext) -> str:
        return REVIEWER_TOKEN if case.path.startswith("/api/v1/review-packets") else OWNER_TOKEN

    def set(self, case: schemathesis.Case, data: str, context: schemathesis.AuthContext) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@dataclass
class World:
    ids: dict[str, list[int]] = field(default_factory=dict)


def fixed_token(project: Project, raw: str, permissions: list[str], session: Session | None = None) -> ApiToken:
    return ApiToken.objects.create(
        name=raw[4:20], project=project, session=session, key_hash=ApiToken.hash_key(raw), key_prefix=raw[:12],
        permissions=sorted(permissions),
    )


def build_world() -> World:
    project = make_project("fuzz")
    fixed_token(project, OWNER_TOKEN, ALL_PERMISSIONS)
    owner = caller_for(project)
    spec = sessions.NewSession(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="claude-code")
    runtime = RuntimeSpec(runtime_family="claude-code", capabilities=["draft", "continuity"], lease_seconds=600)

    # A running writer: live runtime, open run, a checkpoint and a transcript entry.
    writer = sessions.create_session(owner, spec, runtime=runtime)
    run = runs.start_run(owner, writer.id, cursor={"step": "draft"})
    append_transcript(owner, writer.id, role="user", content="Write chapter one.")
    art = artifacts.create_artifact(owner, name="chapter-01", kind="chapter", content="It was a dark night.")
    v2 = artifacts.add_artifact_version(owner, art.id, content="It was a dark and stormy night.")
    art.refresh_from_db()
    cp = checkpoints.record_checkpoint(owner, run.id, {
        "boundary": "context_freeze", "cursor": {"step": "draft"},
        "artifacts": [{"artifact_id": art.id, "fingerprint": art.current_version.fingerprint}],
    })

    # A second running session that handed off two frozen jobs (it is awaiting_external now):
    # one still pending, one claimed under a lease (fencing token 1, the smallest valid one).
    waiting = sessions.create_session(owner, spec, runtime=runtime)
    waiting_run = runs.start_run(owner, waiting.id, cursor={"step": "handoff"})
    jobs = [
        handoffs.create_handoff(
            owner, waiting_run.id, logical_id=f"chapter-01/{check}",
            inputs=[{"artifact_id": art.id, "fingerprint": art.current_version.fingerprint}],
            params={"task": f"check {check}"}, result_schema={"verdict": "string"},
            required_capabilities=["continuity"], timeout_seconds=600,
        ).handoff
        for check in ("continuity", "pacing")
    ]
    handoffs.claim_handoff(owner, worker="fuzz-worker", capabilities=["continuity"], handoff_id=jobs[1].id)

    # A write intent proposing the second version as current.
    before = intents.read_before_state(owner, kind="artifact.make_current", artifact_id=art.id)
    intent = intents.create_intent(
        owner, kind="artifact.make_current", idempotency_key="fuzz-1", before_fingerprint=before.fingerprint,
        params={"version_id": v2.id}, artifact_id=art.id,
    ).intent

    # An agent-route review gate on the writer, assigned to a reviewer session with its own token.
    reviewer = sessions.create_session(
        owner, sessions.NewSession(role="semantic_reviewer", memory_policy="none", task_mode="review", runtime_family="codex"),
        runtime=RuntimeSpec(runtime_family="codex", capabilities=["review"], lease_seconds=600),
    )
    fixed_token(project, REVIEWER_TOKEN, ["read", "review"], session=reviewer)
    gate = review_actions.open_gate(owner, writer.id, review_actions.GateSpec(
        candidate_version_id=art.current_version_id,
        rubric={"criteria": [{"key": "clarity", "label": "Clarity", "scale": {"min": 1, "max": 5}}], "evidence": []},
        route="agent", required_verdicts=1, reviewer_session_ids=[reviewer.id],
    ))

    # A webhook endpoint (a literal public address: no DNS) with a failed delivery to redeliver.
    endpoint, _secret = webhook_endpoints.create_endpoint(project, url="https://93.184.216.34/hook", event_types=["*"])
    event = project.events.order_by("-id").first()
    now = timezone.now()
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, event_id=event.id, event_type=event.type, webhook_id=f"msg_fuzz{event.id}",
        state=DeliveryState.FAILED, attempts=3, next_attempt_at=now, expires_at=now,
    )

    ids = {
        "webhook_id": [endpoint.id],
        "delivery_id": [delivery.id],
        "session_id": [writer.id, waiting.id, reviewer.id],
        "run_id": [run.id, waiting_run.id],
        "runtime_id": list(writer.runtimes.values_list("id", flat=True)) + list(waiting.runtimes.values_list("id", flat=True)),
        "checkpoint_id": [cp.id],
        "artifact_id": [art.id],
        "version_id": [art.current_version_id, v2.id],
        "handoff_id": [job.id for job in jobs],
        "intent_id": [intent.id],
        "gate_id": [gate.id],
        "packet_id": [gate.packet.id],
    }
    return World(ids=ids)


@pytest.fixture
def world(db) -> World:
    return build_world()


@pytest.fixture
def in_process_app() -> Iterator[None]:
    """Keep the test's connection (and transaction) across in-process WSGI requests.

    Django closes "old" connections when a request starts and finishes; inside the test's
    transaction that would close the connection under the test. Django's own test client
    disconnects the same handler around each request.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def substitute_ids(case: schemathesis.Case, world: World) -> None:
    """Point most generated integer path ids at real rows; keep every fifth one as generated (404 path).

    Only a valid integer (an int, or the digits the coverage phase sends) is replaced, by
    another valid integer, so a case meant to be negative stays negative and vice versa.
    """
    for name, value in list((case.path_parameters or {}).items()):
        real = world.ids.get(name)
        if isinstance(value, str) and value.isascii() and value.isdigit():
            value = int(value)
        if real and isinstance(value, int) and not isinstance(value, bool) and value % 5 != 4:
            case.path_parameters[name] = real[value % len(real)]


def keep_host(case: schemathesis.Case) -> None:
    """Drop a generated ``Host`` header (schemathesis may send one among its made-up headers).

    A request for another host is not a request to this API: every path refuses it at the edge,
    before any route, with a typed 400 ``disallowed_host`` (tests/test_allowed_hosts.py). The
    schema describes what the API answers at its own host, which is what this test checks."""
    if case.headers:
        case.headers = {name: value for name, value in case.headers.items() if name.lower() != "host"}


def assert_error_shape(response: schemathesis.Response) -> None:
    """Every refusal, whatever raised it, renders the one error shape (checked on the wire)."""
    if response.status_code < 400:
        return
    what = f"{response.request.method} {response.request.url} -> {response.status_code}: {response.text[:300]!r}"
    assert response.headers.get("content-type", [""])[0].startswith("application/json"), what
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, what
    error = body["error"]
    assert set(error) == {"code", "message", "details"}, what
    assert isinstance(error["code"], str) and error["code"], what
    assert isinstance(error["message"], str) and error["message"], what
    assert isinstance(error["details"], dict), what


@pytest.mark.django_db
@schema.parametrize()
# The world is built once per operation; its state carrying over between examples is wanted.
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_api_conforms(case: schemathesis.Case, world: World, in_process_app: None) -> None:
    substitute_ids(case, world)
    keep_host(case)
    response = case.call_and_validate()
    assert_error_shape(response)


@pytest.mark.django_db
def test_every_path_id_of_the_schema_can_name_a_real_row() -> None:
    """A new route with a new kind of id must give the fuzz real rows for it (see ``build_world``)."""
    names = {
        param["name"]
        for item in schema.raw_schema["paths"].values() for op in item.values()
        for param in op.get("parameters", []) if param["in"] == "path"
    }
    assert len(names) >= 10
    ids = build_world().ids
    assert names <= set(ids), names - set(ids)
    assert all(ids[name] for name in names)
