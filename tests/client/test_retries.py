"""Retries that cannot act twice, through a loopback proxy that loses the server's answer after
the server committed (tests/client/proxy.py): a write carrying its logical id / idempotency key is
retried and answers the original outcome with nothing duplicated (the client sends a fresh key
with every checkpoint, run start, attach, batch, handoff and review gate); a write without one is
not retried (``TransportError(maybe_committed=True)``) and was written exactly once."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from novelforge_client import AsyncClient, Client, RetryPolicy
from novelforge_client import errors as E
from novelforge_sessions.control.models import ConsumeReceipt, Handoff, ResultDelivery, WriteIntent
from novelforge_sessions.models import Checkpoint, Event, IdempotentRequest, Run, RuntimeAttachment
from reviews.models import ReviewGate

from tests.client.proxy import DroppingProxy
from tests.reviews.factories import RUBRIC

pytestmark = pytest.mark.django_db(transaction=True)

FAST = RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05)
WRITER = dict(role="writer", memory_policy="bounded", task_mode="drafting", runtime_family="cli")


@pytest.fixture
def proxy(server):
    p = DroppingProxy(server.port)
    yield p
    p.close()


def _running(nf: Client):
    s = nf.create_session(**WRITER, runtime={"runtime_family": "cli", "lease_seconds": 300})
    return s, nf.start_run(s.id, cursor={"step": "outline"})


def test_a_handoff_whose_answer_was_lost_is_retried_and_answers_the_same_handoff(proxy, token):
    nf = Client(proxy.url, token, retry=FAST)
    s, run = _running(nf)
    proxy.drop_responses = 1
    job = nf.hand_off(run.id, "check-1", required_capabilities=["lint"], params={"n": 1})
    assert proxy.dropped == 1 and proxy.forwarded[("POST", f"/api/v1/runs/{run.id}/handoffs")] == 2
    assert list(Handoff.objects.values_list("id", "logical_id")) == [(job.id, "check-1")]
    assert Event.objects.filter(type="handoff.created").count() == 1


def test_a_delivery_whose_answer_was_lost_is_retried_and_consumed_once(proxy, token, worker_token):
    nf, worker = Client(proxy.url, token, retry=FAST), Client(proxy.url, worker_token, retry=FAST)
    s, run = _running(nf)
    job = nf.hand_off(run.id, "check-2", required_capabilities=["lint"])
    lease = worker.claim("w", ["lint"])
    proxy.drop_responses = 1
    out = worker.deliver(job.id, fencing_token=lease.fencing_token, job_fingerprint=job.job_fingerprint, result={"ok": True})
    assert proxy.dropped == 1 and proxy.forwarded[("POST", f"/api/v1/handoffs/{job.id}/results")] == 2
    # the retry answers the first delivery's outcome: consumed once, one receipt
    assert out.outcome == "already_consumed" and out.original.outcome == "consumed"
    assert out.original.delivery_id == ResultDelivery.objects.order_by("id").first().id
    receipt = ConsumeReceipt.objects.get()
    assert out.receipt.id == receipt.id and receipt.logical_id == "check-2"
    assert Event.objects.filter(type="handoff.result_consumed").count() == 1 and nf.session(s.id).status == "running"


def test_a_write_intent_whose_answer_was_lost_replays_its_idempotency_key(proxy, token):
    nf = Client(proxy.url, token, retry=FAST)
    art = nf.create_artifact("ch", "one\n")
    v2 = nf.add_version(art.id, "two\n")
    before = nf.before_state("artifact.make_current", artifact_id=art.id)
    proxy.drop_responses = 1
    intent = nf.propose_write("artifact.make_current", idempotency_key="k-1", before_fingerprint=before.before_fingerprint,
                              params={"version_id": v2.id}, artifact_id=art.id)
    assert proxy.dropped == 1 and intent.replayed is True
    assert list(WriteIntent.objects.values_list("id", flat=True)) == [intent.id]


def test_a_checkpoint_whose_answer_was_lost_replays_its_idempotency_key(proxy, token):
    """The client sends every checkpoint with an idempotency key: the retry after the dropped
    answer gets the checkpoint the server committed (200 replay), not a second one."""
    nf = Client(proxy.url, token, retry=FAST)
    s, run = _running(nf)
    proxy.drop_responses = 1
    cp = nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": "outline"})
    assert proxy.dropped == 1
    assert proxy.forwarded[("POST", f"/api/v1/runs/{run.id}/checkpoints")] == 2  # sent, lost, repeated
    assert list(Checkpoint.objects.values_list("id", "seq")) == [(cp.id, 1)]  # one effect
    assert Event.objects.filter(type="checkpoint.recorded").count() == 1
    assert [c.seq for c in nf.checkpoints(run.id)] == [1]


def test_every_keyed_create_whose_answer_was_lost_is_replayed_once(proxy, token):
    """Start a run, attach, a batch, a handoff and a review gate: each answer is lost once after the
    server committed; the client's retry (same key, same bytes) gets the first answer, and exactly
    one row and one event exist for each."""
    nf = Client(proxy.url, token, retry=FAST)
    s = nf.create_session(**WRITER)

    def lost(path: str, call):
        before = proxy.forwarded[("POST", f"/api/v1{path}")]
        proxy.drop_responses = 1
        out = call()
        assert proxy.dropped == lost.dropped + 1 and proxy.forwarded[("POST", f"/api/v1{path}")] == before + 2
        lost.dropped += 1
        return out

    lost.dropped = 0
    runtime = lost(f"/sessions/{s.id}/runtimes", lambda: nf.attach(s.id, "cli", lease_seconds=300))
    assert list(RuntimeAttachment.objects.values_list("id", flat=True)) == [runtime.id]
    assert nf.runtime_for(s.id) == runtime.id
    run = lost(f"/sessions/{s.id}/runs", lambda: nf.start_run(s.id, cursor={"step": "outline"}))
    assert list(Run.objects.values_list("id", flat=True)) == [run.id] and run.state == "open"
    steps = lost(f"/runs/{run.id}/batch", lambda: nf.batch(run.id, [
        {"kind": "checkpoint", "checkpoint": {"boundary": "context_freeze", "cursor": {"step": 1}}},
        {"kind": "cursor", "cursor": {"step": 2}}]))
    assert steps.checkpoint_count == 1 and list(Checkpoint.objects.values_list("id", flat=True)) == [steps.items[0].checkpoint.id]
    art = nf.create_artifact("chapter", "one\n")
    gate = lost(f"/sessions/{s.id}/review-gates", lambda: nf.open_review_gate(
        s.id, candidate_version_id=art.current_version_id, rubric=RUBRIC, route="agent", required_verdicts=1))
    assert list(ReviewGate.objects.values_list("id", flat=True)) == [gate.id]
    job = lost(f"/runs/{run.id}/handoffs", lambda: nf.hand_off(run.id, "keyed-check", required_capabilities=["lint"]))
    assert list(Handoff.objects.filter(purpose="job").values_list("id", flat=True)) == [job.id]
    counts = {t: Event.objects.filter(type=t).count() for t in (
        "runtime.attached", "run.started", "checkpoint.recorded", "run.cursor_advanced", "review.gate_opened",
        "handoff.created")}
    assert counts == {"runtime.attached": 1, "run.started": 1, "checkpoint.recorded": 1, "run.cursor_advanced": 1,
                      "review.gate_opened": 1, "handoff.created": 2}  # the gate's agent slot is a handoff too
    assert IdempotentRequest.objects.count() == 5


def test_503_is_retried_for_reads_and_not_for_unkeyed_writes(proxy, token):
    nf = Client(proxy.url, token, retry=FAST)
    s, run = _running(nf)
    proxy.fail_with_503 = 1
    assert nf.session(s.id).id == s.id  # a read: retried
    proxy.fail_with_503 = 1  # (the proxy fails a connection's first request: a fresh client)
    with pytest.raises(E.InternalError) as info:
        Client(proxy.url, token, retry=FAST).append_transcript(s.id, "assistant", "hello", runtime_id=s.runtime_id)
    assert info.value.status == 503 and nf.list_transcript(s.id).items == []


def test_a_request_that_never_left_is_retried_whatever_it_is(server, token):
    """A connection refused before sending is safe to repeat even for an unkeyed write."""
    class RefuseFirst(httpx.HTTPTransport):
        refused = 0

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if request.method == "POST" and RefuseFirst.refused == 0:
                RefuseFirst.refused += 1
                # a real refused connection: nothing listens on this port
                return httpx.HTTPTransport().handle_request(httpx.Request("POST", f"http://127.0.0.1:{_closed_port()}/"))
            return super().handle_request(request)

    nf = Client(server.url, token, retry=FAST, transport=RefuseFirst())
    s = nf.create_session(**WRITER)
    assert RefuseFirst.refused == 1 and [x.id for x in nf.sessions()] == [s.id]


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_async_client_retries_the_same_way(proxy, token):
    async def scenario() -> tuple[int, int]:
        async with AsyncClient(proxy.url, token, retry=FAST) as nf:
            s = await nf.create_session(**WRITER, runtime={"runtime_family": "cli"})
            run = await nf.start_run(s.id, cursor={"step": "a"})
            proxy.drop_responses = 1
            job = await nf.hand_off(run.id, "async-check", required_capabilities=["lint"])
            proxy.drop_responses = 1
            cp = await nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": "a"})
            return job.id, run.id, cp.id

    job_id, run_id, cp_id = asyncio.run(scenario())
    assert list(Handoff.objects.values_list("id", flat=True)) == [job_id]
    assert proxy.forwarded[("POST", f"/api/v1/runs/{run_id}/handoffs")] == 2
    assert proxy.forwarded[("POST", f"/api/v1/runs/{run_id}/checkpoints")] == 2
    assert list(Checkpoint.objects.values_list("id", flat=True)) == [cp_id]
