"""The sync client's default transport (novelforge_client/_wire.py) against a live server, through
the loopback proxy of tests/client/proxy.py (which counts connections and can close them): calls
share one keep-alive connection, a connection the server closed while idle is replaced without
being taken for a lost answer, a retried checkpoint reuses its idempotency key, concurrent threads
each get a connection, and an environment proxy sends the client through httpx."""
from __future__ import annotations

import threading

import pytest

from novelforge_client import Client, RetryPolicy
from novelforge_client import errors as E
from novelforge_client._wire import usable
from novelforge_sessions.models import Checkpoint, Event, TranscriptEntry

from tests.client.proxy import DroppingProxy

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


def test_calls_share_one_keep_alive_connection(proxy, token):
    with Client(proxy.url, token, retry=FAST) as nf:
        s, run = _running(nf)
        cps = [nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": i}) for i in range(5)]
        assert [c.seq for c in nf.checkpoints(run.id)] == [c.seq for c in cps] == [1, 2, 3, 4, 5]
    assert proxy.connections == 1
    assert proxy.forwarded[("POST", f"/api/v1/runs/{run.id}/checkpoints")] == 5


def test_a_connection_closed_while_idle_is_replaced_not_taken_for_a_lost_answer(proxy, token):
    """An unkeyed write after the server closed the idle connection is sent once on a new
    connection: never ``TransportError(maybe_committed=True)``, never written twice."""
    nf = Client(proxy.url, token, retry=RetryPolicy(attempts=1))  # no retry could hide a failure
    s, run = _running(nf)
    proxy.close_connections()
    entry = nf.append_transcript(s.id, "assistant", "after the idle close")
    assert proxy.connections == 2
    assert list(TranscriptEntry.objects.filter(session_id=s.id).values_list("seq", "content")) == [
        (entry.seq, "after the idle close")]


def test_a_retried_checkpoint_sends_the_same_idempotency_key_and_the_server_holds_one_row(proxy, token):
    nf = Client(proxy.url, token, retry=FAST)
    s, run = _running(nf)
    proxy.drop_responses = 1
    cp = nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": "a"})
    assert proxy.dropped == 1 and proxy.forwarded[("POST", f"/api/v1/runs/{run.id}/checkpoints")] == 2
    rows = list(Checkpoint.objects.filter(run_id=run.id).values_list("id", "idempotency_key"))
    assert len(rows) == 1 and rows[0][0] == cp.id and rows[0][1]  # one row, written with a key
    # the key the retry carried is the one the first attempt wrote: a caller's own key proves it
    proxy.drop_responses = 1
    again = nf.checkpoint(run.id, boundary="context_freeze", cursor={"step": "b"}, idempotency_key="cp-b")
    assert Checkpoint.objects.filter(run_id=run.id, idempotency_key="cp-b").get().id == again.id
    assert Event.objects.filter(type="checkpoint.recorded", session_id=s.id).count() == 2


def test_an_answer_lost_for_an_unkeyed_write_is_not_retried(proxy, token):
    nf = Client(proxy.url, token, retry=FAST)
    s, _ = _running(nf)
    proxy.drop_responses = 1
    with pytest.raises(E.TransportError) as info:
        nf.append_transcript(s.id, "assistant", "once")
    assert info.value.maybe_committed is True
    assert TranscriptEntry.objects.filter(session_id=s.id).count() == 1


def test_threads_share_the_client_each_on_its_own_connection(proxy, token):
    nf = Client(proxy.url, token, retry=FAST)
    runs = [_running(nf)[1] for _ in range(4)]
    barrier = threading.Barrier(len(runs))
    failures: list[BaseException] = []

    def checkpoint_many(run_id: int) -> None:
        try:
            barrier.wait()
            for i in range(10):
                nf.checkpoint(run_id, boundary="context_freeze", cursor={"step": i})
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=checkpoint_many, args=(r.id,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert {r.id: Checkpoint.objects.filter(run_id=r.id).count() for r in runs} == {r.id: 10 for r in runs}
    assert 1 <= proxy.connections <= len(runs)


def test_a_refused_connection_is_a_transport_error_that_was_never_sent(token):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(E.TransportError) as info:
            Client(f"http://127.0.0.1:{port}", token, retry=RetryPolicy(attempts=2, backoff=0.01)).append_transcript(
                1, "assistant", "never sent")
    assert info.value.maybe_committed is False


def test_an_environment_proxy_sends_the_client_through_httpx(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert usable("http://127.0.0.1:8000") and usable("https://nf.example")
    assert not usable("unix:///run/nf.sock")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert usable("http://127.0.0.1:8000") and not usable("https://nf.example")
    monkeypatch.setenv("ALL_PROXY", "http://proxy.example:3128")
    assert not usable("http://127.0.0.1:8000")
