"""A LangGraph checkpointer backed by the NovelForge Session Runtime (``pip install novelforge-sessions[langgraph]``).

In LangGraph's terms, and ours:

* a LangGraph **thread** is a **session**: the thread's first checkpoint opens one (runtime
  generation 1, run 1; ``thread_spec`` says with which role, memory policy, task mode);
* a LangGraph **checkpoint** is a **bounded checkpoint** of the session's open run: a cursor
  naming the graph checkpoint and the fingerprints of the state; every channel value is a
  **content-addressed artifact** (``blob:sha256:…``), so the checkpoint stays bounded whatever the
  state holds (the server refuses transcripts in checkpoints; a ``messages`` channel is a blob);
* ``interrupt()`` is a **wait**: a plain interrupt moves the session to ``awaiting_user``; an
  interrupt raised by :func:`review_gate` opens a **review gate** (the page and relay routes wait
  on a person, ``awaiting_user``; the agent route on an agent reviewer, ``awaiting_external``), and
  either way a ``user_wait``/``external_wait`` checkpoint records what the run waits on;
* **resuming** the graph after its process went away is :meth:`NovelForgeSaver.resume`: the
  session's resume revalidation (framework, authority, artifact fingerprints, approvals, the gate's
  verdict, …), then runtime generation N+1 and a new run that takes the graph's next checkpoints;
  a refused resume raises with the report;
* ``delete_thread`` closes the session's runtime and forgets the session;
* ``copy_thread`` opens a new session holding a copy of the thread's history (values shared by
  fingerprint); ``prune`` (``keep_latest``, ``delete``) and ``delete_for_runs`` remove
  checkpoints, each session recording what went;
* the **runtime** of every thread the saver opened or resumed is heartbeaten in the background
  (one daemon thread, every third of the lease) until the thread is let go or the saver closed;
  a runtime found no longer live raises :class:`~novelforge_client.errors.LeaseLost` from the
  thread's next put, write or read; a run a manager asked to stop (a heartbeat says so) is ended
  ``aborted`` and :class:`~novelforge_client.errors.RunAborted` raised from its next put or write;
* a graph that calls :func:`review_gate` runs on a thread opened with
  ``ThreadSpec(opens_gates=True)`` (a writer session: only writers and managers open gates).

Usage::

    from novelforge_client.langgraph import NovelForgeSaver
    saver = NovelForgeSaver(url="http://127.0.0.1:8000", token=os.environ["NOVELFORGE_TOKEN"])
    graph = builder.compile(checkpointer=saver)
    graph.invoke(inputs, {"configurable": {"thread_id": "chapter-3"}})

Sync and async (``aget_tuple``, ``alist``, ``aput``, ``aput_writes``, ``adelete_thread``,
``acopy_thread``, ``aprune``, ``adelete_for_runs``) share one request builder. Requests go over the client's keep-alive ``http.client`` connections
(:mod:`novelforge_client._wire`, as :class:`~novelforge_client.Client` sends them: a graph saves a
checkpoint every superstep, on the machine of the service and its database, and ``httpx``'s
general-purpose request machinery was most of the saver's CPU per superstep); through ``httpx``
when a ``transport``/``async_transport`` is given or the environment sets a proxy.

Values travel once: each is named by its fingerprint (the sha256 of its content, as the server
computes it). A value the server holds (this saver sent it, or the server said so) is sent by
fingerprint only; a new small one rides inline in the put or write itself; a value too large for
one request body is uploaded first in chunks (``POST /graph-blobs``), then named. A small scalar
(``None``, a bool, a small int, a short str) needs no blob: a put carries its channels' ones in the
checkpoint itself (``values``), a task's write in its own row (``scalar``). A task's
ordinary writes are held for the put that follows them and ride in its body (``hold_writes``,
sync and async alike), so a superstep costs one request, unless a value is larger than what fits
inline.
"""
from __future__ import annotations

import asyncio
import base64
import builtins
import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import httpx

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
    from langgraph.checkpoint.serde.types import INTERRUPT
    from langgraph.types import interrupt
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "novelforge_client.langgraph needs LangGraph: pip install 'novelforge-sessions[langgraph]'"
    ) from exc

from novelforge_client._core import JSON_CONTENT, NOT_SENT, Call
from novelforge_client._wire import AsyncWire, Socket, Wire, usable
from novelforge_client.errors import (
    Conflict, GraphBlobMissing, LeaseLost, NotFound, NovelForgeError, PayloadTooLarge, RunAborted, RuntimeNotLive, StaleRuntime,
    error_for,
)

__all__ = ["NovelForgeSaver", "ThreadSpec", "review_gate", "REVIEW_GATE_KEY", "LeaseLost", "RunAborted"]

log = logging.getLogger("novelforge_client.langgraph")

#: The key of an interrupt value that asks for a review gate (see :func:`review_gate`).
REVIEW_GATE_KEY = "novelforge_review_gate"
_API = "/api/v1"
#: The server's page maximum (``?limit=`` is 1..200 on every list route; out of range is a 422).
PAGE_MAX = 200
#: The server's default request body limit (``API_MAX_BODY_BYTES``); pass ``max_body_bytes=`` for another.
DEFAULT_MAX_BODY_BYTES = 256 * 1024
#: The largest chunk of a blob's base64 text the server takes (``control/graphs.MAX_CHUNK_CHARS``).
MAX_CHUNK_CHARS = 192 * 1024
#: Room left in a body for what is not a value (ids, checkpoint document, JSON punctuation).
_BODY_MARGIN = 4 * 1024
#: How long a task's ordinary writes wait for the put that follows them (they ride in its body:
#: one request per superstep) before they are sent on their own.
HOLD_WRITES_SECONDS = 0.1
#: How many fingerprints the saver remembers as held by the server (the oldest are forgotten:
#: such a value is then sent again, which the server stores once).
KNOWN_MAX = 100_000
#: How many thread ids one prune, or run ids one delete for runs, may name (``control/graphs.MAX_THREADS_PER_CALL``).
_IDS_MAX = 200
#: How many fingerprints one ``POST /graph-blobs/missing`` may ask about.
_ASK_MAX = 500
#: Sends of a request that failed before it left this process (what ``httpx.HTTPTransport(retries=2)``
#: gives the httpx path): every graph request is safe to repeat, but only these are repeated here.
_SENDS = 3
#: The part of a runtime's lease between two of the saver's heartbeats (a third: two beats may
#: fail before the lease runs out).
HEARTBEAT_FRACTION = 1 / 3
#: Heartbeat refusals that mean the runtime will never be live again (``novelforge_client.runtime``
#: reads them the same way): the lease ran out and the reconciler marked it lost, the session was
#: closed, failed or forgotten, or a newer generation took over.
_LOST = (RuntimeNotLive, StaleRuntime, NotFound)
#: A channel value put inline, in the checkpoint itself, instead of as a blob (as LangGraph's own
#: PostgreSQL saver keeps primitive values in its checkpoint row): ``None``, a ``bool``, an ``int``
#: of at most 2**53 in magnitude or a ``str`` of at most 256 characters that PostgreSQL can store
#: (``control/graphs.MAX_INLINE_*``), and at most ``_INLINE_BYTES`` of them per put. Exact types
#: only: a subclass (an enum, say) goes through the serializer, which keeps its type.
_INLINE_INT = 2**53
_INLINE_CHARS = 256
_INLINE_BYTES = 16 * 1024 - 512
#: At most this many channels inline in one put (the server's limit on ``values``; the rest go as blobs).
_INLINE_MAX = 500
#: A task's write whose value is such a scalar is kept in the write's own row (``scalar``: no
#: blob to serialize, send, store or lock), up to this share of the request body limit of them
#: per task (a 128th: 2 KiB of the default 256 KiB; the rest go as blobs), so a put carries the
#: writes of many held tasks (:data:`_PUT_TASKS`, within :data:`_PUT_WRITES_SHARE` of the limit).
_WRITE_SCALAR_SHARE = 128
#: How many tasks' held writes one put carries (``control/graphs.MAX_PUT_TASK_WRITES``): a
#: superstep of more tasks (a fan-out through ``Send``) stores the others on their own first.
_PUT_TASKS = 64
#: How many of a task's writes one request carries (the server's limit per task and request): a
#: task writing more (a node fanning out to hundreds of ``Send`` s) is sent in parts, under the same
#: task id, each write at its own index.
_TASK_WRITES = 200
#: The part of the request body limit a put gives to the held writes it carries (their entries:
#: channel, index, fingerprint); held tasks past it are stored on their own first. The rest is for
#: the checkpoint and the values.
_PUT_WRITES_SHARE = 2
#: The most a checkpoint's metadata may take (``control/graphs.MAX_METADATA_BYTES``, UTF-8 bytes of
#: its compact JSON). LangGraph copies every string and number of a run's ``configurable`` (and
#: ``metadata``) into each checkpoint's metadata; copied values past it are left out, longest first.
_METADATA_BYTES = 16 * 1024
#: Channels named like a conversation or private reasoning are always blobs (the server keeps
#: them out of its checkpoint rows: ``session_runtime.TRANSCRIPT_KEYS``, compared lowercased).
_CONVERSATION_CHANNELS = frozenset({
    "transcript", "messages", "chat", "chat_history", "history", "conversation", "dialogue", "turns", "reasoning",
    "private_reasoning", "chain_of_thought", "thoughts", "scratchpad",
})


def _json_bytes(value: Any) -> int:
    """UTF-8 bytes of ``value``'s compact JSON, as the server measures its bounds."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _entry_bytes(entry: Mapping[str, Any]) -> int:
    """The room a list entry takes in a body, its value not counted (:meth:`NovelForgeSaver._plan_lists`
    plans for it): its JSON, and 100 bytes for the fingerprint or the value's wrapping."""
    return len(json.dumps(entry)) + 100


def _fitted_metadata(metadata: dict[str, Any], own: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's metadata within :data:`_METADATA_BYTES`: the values copied from the run's
    config (not in LangGraph's ``own`` metadata) left out, longest first, until it fits (logged
    once, naming them: :func:`_left_out`). What LangGraph set itself is kept whatever its size."""
    if _json_bytes(metadata) <= _METADATA_BYTES:
        return metadata
    fitted, left_out = dict(metadata), []
    for key in sorted((k for k in metadata if k not in own), key=lambda k: -_json_bytes({k: metadata[k]})):
        del fitted[key]
        left_out.append(key)
        if _json_bytes(fitted) <= _METADATA_BYTES:
            break
    _left_out(tuple(left_out))
    return fitted


@functools.lru_cache(maxsize=64)
def _left_out(keys: tuple[str, ...]) -> None:
    """Say once (per process and set of keys, not on every put of a long run) which config values
    :func:`_fitted_metadata` left out."""
    log.warning("checkpoint metadata past %d bytes: left out the config values %s (LangGraph copies a run's "
                "configurable strings and numbers into each checkpoint's metadata)", _METADATA_BYTES, list(keys))


def _inlined(value: Any) -> bool:
    """Whether a channel's value travels inline (:data:`_INLINE_CHARS` …) rather than as a blob."""
    kind = type(value)
    if value is None or kind is bool:
        return True
    if kind is int:
        return -_INLINE_INT <= value <= _INLINE_INT
    if kind is str and len(value) <= _INLINE_CHARS and "\x00" not in value:
        if value.isascii():
            return True
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # an unpaired surrogate: PostgreSQL cannot store it as text
            return False
        return True
    return False


def _kept_inline(channel: str, value: Any) -> bool:
    """Whether a channel's value may be kept without a blob (a put's ``values``, a task's write's
    ``scalar``): its name is not a conversation's and the value is :func:`_inlined` (what the
    server accepts inline)."""
    return channel.lower() not in _CONVERSATION_CHANNELS and _inlined(value)


def _inlinable(channel: str, value: Any, versions: Mapping[str, Any]) -> bool:
    """Whether a channel's value may go inline in a put: it has a version and is :func:`_kept_inline`."""
    return channel in versions and _kept_inline(channel, value)


def _inline_values(values: Mapping[str, Any], versions: Mapping[str, Any]) -> dict[str, Any]:
    """The channel values a put sends inline: each :func:`_inlinable`, in all at most
    :data:`_INLINE_BYTES` of compact JSON and :data:`_INLINE_MAX` channels (the rest go as blobs)."""
    inline: dict[str, Any] = {}
    size = 2
    for channel, value in values.items():
        if len(inline) == _INLINE_MAX:
            break
        if _inlinable(channel, value, versions):
            more = _json_bytes({channel: value})
            if size + more > _INLINE_BYTES:
                continue
            inline[channel] = value
            size += more
    return inline


@dataclass(frozen=True)
class _Value:
    """A serialized value: its serializer tag, its bytes in base64, and its fingerprint."""

    serde: str
    data: str
    fingerprint: str

    @property
    def size(self) -> int:
        """Its bytes inline in a JSON body (the value object, with room for its keys)."""
        return len(self.data) + len(self.serde) + 64


def _value_of(serde: str, data: str) -> _Value:
    # The server's fingerprint of a blob: sha256 of the compact, key-sorted JSON of both fields.
    content = json.dumps({"serde": serde, "data": data}, sort_keys=True, separators=(",", ":"))
    return _Value(serde, data, "sha256:" + hashlib.sha256(content.encode()).hexdigest())


@dataclass
class _Plan:
    """A put's or write's body, and the chunk uploads that must land before it."""

    body: dict[str, Any]
    ask: list[str]
    uploads: list[_Value]
    named: list[str]
    #: the values this request carries (inline or uploaded) that no other request of this saver
    #: carries at the same time; set when this request is done
    claimed: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    #: requests carrying values this one names: wait for them, then plan again
    waits: list[threading.Event] = field(default_factory=list)


@dataclass(frozen=True)
class _Held:
    """A task's writes (at most :data:`_TASK_WRITES` of them: a part of a task writing more), held
    for the put that follows them or sent now."""

    at: float  # time.monotonic() when made
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    task_path: str
    entries: list[tuple[dict[str, Any], _Value | None]]
    #: the bytes it takes in a put's body, values not counted (:func:`_entry_bytes`, and its ids)
    size: int = field(init=False)

    def __post_init__(self) -> None:
        ids = _entry_bytes({"checkpoint_id": self.checkpoint_id, "task_id": self.task_id, "task_path": self.task_path})
        object.__setattr__(self, "size", ids + sum(_entry_bytes(e) for e, _ in self.entries))


@dataclass
class _Lease:
    """A thread's runtime the saver heartbeats (its background thread's schedule)."""

    thread_id: str
    runtime_id: int
    lease_seconds: int | None  # None: the server's default, asked of the server first
    due: float  # time.monotonic() of the next beat (or of asking the lease)
    since: float  # time.monotonic() when the saver took the runtime (its lease fresh)
    beats: int = 0

    @property
    def interval(self) -> float:
        return (self.lease_seconds or 1) * HEARTBEAT_FRACTION


#: The session roles that open review gates on their own work (docs/model.md, roles): the service
#: refuses a gate to any other (403 ``forbidden``); a graph-thread is a ``specialist`` by default.
GATE_OPENER_ROLES = ("writer", "manager")


@dataclass(frozen=True)
class ThreadSpec:
    """How a new thread's session is opened (its first checkpoint opens it).

    ``opens_gates=True``: the graph opens review gates (:func:`review_gate`), which only a writer
    or manager session may; the thread is then opened as a ``writer`` unless ``role`` names the
    ``manager``. Without it the thread is a ``specialist`` (no gates: refused ``forbidden``)."""

    role: str = ""  # "": ``specialist``, or ``writer`` with ``opens_gates``
    memory_policy: str = "checkpoint_only"
    task_mode: str = "langgraph"
    runtime_family: str = "langgraph"
    capabilities: list[str] = field(default_factory=list)
    lease_seconds: int | None = None
    opens_gates: bool = False

    def __post_init__(self) -> None:
        role = self.role or ("writer" if self.opens_gates else "specialist")
        if self.opens_gates and role not in GATE_OPENER_ROLES:
            raise ValueError(f"a thread that opens review gates is a writer or manager session, not {role!r}: "
                             "leave role unset (writer) or name one of " + ", ".join(GATE_OPENER_ROLES))
        object.__setattr__(self, "role", role)

    def open_body(self) -> dict[str, Any]:
        """The ``open`` object of a put or write (the session's fields; ``opens_gates`` chose the role)."""
        body = asdict(self)
        del body["opens_gates"]
        return body


def review_gate(
    *, candidate_version_id: int, rubric: Mapping[str, Any], route: str = "agent", reviewers: Sequence[str] = (),
    reviewer_session_ids: Sequence[int] = (), evidence: Sequence[Mapping[str, Any]] = (),
    required_verdicts: int | None = None, **extra: Any,
) -> Any:
    """Inside a graph node: pause the graph on a review gate; returns what the graph is resumed with.

    The checkpointer opens the gate (``POST /sessions/{id}/review-gates``, blind packet, routing)
    when LangGraph stores the interrupt; resume the graph with ``Command(resume=verdict)`` once
    the verdict is bound (:meth:`NovelForgeSaver.wait_for_gate` returns the gate with it). Only a
    writer or manager session opens gates: open the thread with ``ThreadSpec(opens_gates=True)``
    (the default thread, a specialist, is refused :class:`~novelforge_client.errors.Forbidden`).
    """
    spec: dict[str, Any] = {"candidate_version_id": candidate_version_id, "rubric": dict(rubric), "route": route,
                            **extra}
    if reviewers:
        spec["reviewers"] = list(reviewers)
    if reviewer_session_ids:
        spec["reviewer_session_ids"] = list(reviewer_session_ids)
    if evidence:
        spec["evidence"] = [dict(e) for e in evidence]
    if required_verdicts is not None:
        spec["required_verdicts"] = required_verdicts
    return interrupt({REVIEW_GATE_KEY: spec})


def _configurable(config: RunnableConfig) -> dict[str, Any]:
    return dict(config.get("configurable") or {})


def raise_for_response(response: httpx.Response) -> Any:
    """The JSON body, or the client's typed exception for the error (``novelforge_client.errors``)."""
    return _answer(response.status_code, response.content)


def _answer(status: int, content: bytes) -> Any:
    if status < 400:
        return json.loads(content)
    try:
        body = json.loads(content) if content else None
    except ValueError:
        body = None
    raise error_for(status, body)


def _jsonable(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be JSON-serialisable for the NovelForge checkpointer: {exc}") from exc


class NovelForgeSaver(BaseCheckpointSaver[int]):
    """LangGraph's ``BaseCheckpointSaver`` on the NovelForge Session Runtime's ``/graph-threads`` API."""

    def __init__(
        self, *, url: str | None = None, token: str | None = None, thread_spec: ThreadSpec | None = None,
        serde: SerializerProtocol | None = None, timeout: float = 30.0, transport: httpx.BaseTransport | None = None,
        async_transport: httpx.AsyncBaseTransport | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        hold_writes: bool = True, hold_seconds: float = HOLD_WRITES_SECONDS, heartbeat: bool = True,
    ) -> None:
        super().__init__(serde=serde)
        # A task's small scalar writes are kept in their rows as JSON only with LangGraph's own
        # serializer: a serializer of the caller's (an EncryptedSerializer, say) sees every write,
        # as PostgresSaver passes every write through it. (Small channel values ride inline in a
        # checkpoint whatever the serializer, as PostgresSaver keeps them in its checkpoint row.)
        self._scalar_writes = serde is None or type(serde) is JsonPlusSerializer
        self.url = (url or os.environ.get("NOVELFORGE_URL") or "http://127.0.0.1:8000").rstrip("/")
        token = token or os.environ.get("NOVELFORGE_TOKEN")
        if not token:
            raise ValueError("a NovelForge API token is needed (token=… or NOVELFORGE_TOKEN)")
        self.thread_spec = thread_spec or ThreadSpec()
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        # Every graph request is safe to repeat (a put or write retried is stored once), so
        # connection failures are retried (by the transport, on the httpx path).
        direct = usable(self.url)
        # Puts and writes go over the API socket (one websocket, opened on the first; HTTP where the
        # server has none): the server answers them there without an HTTP request's cost.
        self._wire = (Wire(self.url + _API, headers, timeout, socket=Socket(self.url, headers, timeout))
                      if transport is None and direct else None)
        self._awire = (AsyncWire(self.url + _API, headers, timeout, socket=Socket(self.url, headers, timeout))
                       if async_transport is None and direct else None)
        self._http = None if self._wire is not None else httpx.Client(
            base_url=self.url + _API, headers=headers, timeout=timeout,
            transport=transport or httpx.HTTPTransport(retries=2))
        self._headers, self._timeout, self._async_transport = headers, timeout, async_transport
        self._ahttp: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        #: thread id → the runtime id this saver opened it with (for gates, heartbeats, close).
        self.runtimes: dict[str, int] = {}
        #: threads this saver moved to ``awaiting_user`` (a plain interrupt): the next put continues them.
        self._waiting_on_user: set[str] = set()
        self._limit_body(max_body_bytes)
        #: fingerprints the server holds (LangGraph calls a saver from several threads: locked).
        self._known: OrderedDict[str, None] = OrderedDict()
        #: fingerprint → done event of the request carrying that value now.
        self._inflight: dict[str, threading.Event] = {}
        self._known_lock = threading.Lock()
        #: ``hold_writes``: a task's ordinary writes (no special channel) are held until the put
        #: that follows them and sent in its body (one request per superstep), or on their own
        #: after ``hold_seconds``, before any read, and on close (``_flush_held``).
        self.hold_writes, self.hold_seconds = hold_writes, hold_seconds
        #: (thread id, namespace) → the tasks' writes held for its next put, oldest first
        self._held: dict[tuple[str, str], list[_Held]] = {}
        self._held_lock = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._closed = threading.Event()
        #: ``heartbeat``: one background thread renews the lease of every runtime this saver holds
        #: (``runtimes``) every third of its lease, until the thread is let go or the saver closed.
        self.heartbeats = heartbeat
        self._leases: dict[str, _Lease] = {}
        #: thread id → why its runtime is no longer live (raised by the thread's next put, write or read)
        self._lost: dict[str, LeaseLost] = {}
        #: thread id → its open run a heartbeat said a manager asked to stop (ended at the next put or write)
        self._aborts: dict[str, int] = {}
        #: thread id → the run this saver ended aborted: its puts and writes raise RunAborted until resumed
        self._aborted: dict[str, int] = {}
        self._lease_lock = threading.Lock()
        self._beater: threading.Thread | None = None
        self._wake = threading.Event()

    # ---- plumbing ---------------------------------------------------------------------------------
    def _async_client(self) -> httpx.AsyncClient:
        # One AsyncClient per event loop: LangGraph may call from several loops over a saver's life.
        loop = asyncio.get_running_loop()
        client = self._ahttp.get(loop)
        if client is None:
            client = httpx.AsyncClient(base_url=self.url + _API, headers=self._headers, timeout=self._timeout,
                                       transport=self._async_transport or httpx.AsyncHTTPTransport(retries=2))
            self._ahttp[loop] = client
        return client

    def _call(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None,
              socket: bool = False) -> Any:
        if self._wire is None:
            assert self._http is not None
            return raise_for_response(self._http.request(method, path, json=json, params=params))
        call: Call[Any] = Call(method, path, body=json, params=params or {})
        body = call.content()
        for attempt in range(1, _SENDS + 1):
            try:
                status, content = self._wire.request(method, call.target(), body, JSON_CONTENT if body is not None else {},
                                                     socket=socket)
                return _answer(status, content)
            except NOT_SENT:
                if attempt == _SENDS:
                    raise
        raise AssertionError("unreachable")

    async def _acall(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None,
                     socket: bool = False) -> Any:
        if self._awire is None:
            return raise_for_response(await self._async_client().request(method, path, json=json, params=params))
        call: Call[Any] = Call(method, path, body=json, params=params or {})
        body = call.content()
        for attempt in range(1, _SENDS + 1):
            try:
                status, content = await self._awire.request(method, call.target(), body,
                                                            JSON_CONTENT if body is not None else {}, socket=socket)
                return _answer(status, content)
            except NOT_SENT:
                if attempt == _SENDS:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        for worker in (self._flusher, self._beater):
            if worker is not None and worker is not threading.current_thread():
                worker.join(self._timeout)  # a send it has begun finishes before the wire closes
        self._flush_held()
        if self._wire is not None:
            self._wire.close()
        if self._http is not None:
            self._http.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)
        if self._awire is not None:
            await self._awire.aclose()
        clients, self._ahttp = list(self._ahttp.values()), {}
        for client in clients:
            await client.aclose()

    def _value(self, value: Any) -> _Value:
        serde, data = self.serde.dumps_typed(value)
        return _value_of(serde, base64.b64encode(data).decode())

    def _load(self, blob: Mapping[str, str]) -> Any:
        return self.serde.loads_typed((blob["serde"], base64.b64decode(blob["data"])))

    def _load_write(self, write: Mapping[str, Any]) -> Any:
        """A pending write's value: its ``scalar`` when it has no blob (``fingerprint`` null)."""
        return write.get("scalar") if write.get("fingerprint") is None else self._load(write)

    # ---- values: inline, by fingerprint, or uploaded in chunks ---------------------------------------
    def _limit_body(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self._chunk_chars = max(4, min(MAX_CHUNK_CHARS, (max_body_bytes - 1024) // 4 * 4))

    def _learn_limit(self, exc: PayloadTooLarge) -> bool:
        """A server with a smaller body limit than this saver assumed said so (its 413 names the
        limit): plan with it from now on. False when there is nothing to learn."""
        limit = exc.details.get("limit")
        if isinstance(limit, int) and 2048 < limit < self.max_body_bytes:
            self._limit_body(limit)
            return True
        return False

    def _remember(self, fingerprints: Sequence[str]) -> None:
        """Held by the server (call with the lock held)."""
        for fp in fingerprints:
            self._known[fp] = None
            self._known.move_to_end(fp)
        while len(self._known) > KNOWN_MAX:
            self._known.popitem(last=False)

    def _forget(self, fingerprints: Sequence[str]) -> None:
        with self._known_lock:
            for fp in fingerprints:
                self._known.pop(fp, None)

    def _plan(self, body: dict[str, Any], key: str, entries: list[tuple[dict[str, Any], _Value | None]], *,
              wait: bool) -> _Plan:
        return self._plan_lists(body, [entries], lambda items: {**body, key: items[0]}, wait=wait)

    def _plan_lists(self, body: dict[str, Any], lists: list[list[tuple[dict[str, Any], _Value | None]]],
                    build: Callable[[list[list[dict[str, Any]]]], dict[str, Any]], *, wait: bool) -> _Plan:
        """:meth:`_plan` of a body holding several lists of entries (a put carrying tasks' writes:
        ``build`` makes the body from the lists' items). A value travels once per body, in the
        first list that holds it (the writes, which the server stores first). An entry without a
        value (a write's ``scalar``) is sent as it is.

        Fill ``body[key]`` with the entries, each value by fingerprint when the server holds it,
        inline while the body stays under the limit (smallest first), else by fingerprint after
        a chunked upload.

        LangGraph sends a task's writes and the checkpoint that follows from different threads at
        once, and a node's write is often the very value of the channel it sets: a value another
        request of this saver is carrying is waited for (``wait``) and then named, not sent twice.
        Requests are planned one at a time and wait only for requests planned before them, so no
        two wait for each other."""
        fixed = len(json.dumps(body)) + sum(_entry_bytes(e) for group in lists for e, _ in group)
        entries = [(e, v) for group in lists for e, v in group if v is not None]
        budget = self.max_body_bytes - _BODY_MARGIN - fixed
        inline: set[str] = set()
        uploads: dict[str, _Value] = {}
        plan = _Plan({}, [], [], sorted({v.fingerprint for _, v in entries}))
        with self._known_lock:
            for v in sorted((v for _, v in entries), key=lambda v: v.size):
                fp = v.fingerprint
                if fp in inline or fp in uploads:
                    continue
                if fp in self._known:
                    self._known.move_to_end(fp)
                    continue
                carrier = self._inflight.get(fp)
                if carrier is not None and wait:
                    plan.waits.append(carrier)
                    continue
                if carrier is None:
                    self._inflight[fp] = plan.done
                    plan.claimed.append(fp)
                if v.size <= budget:
                    inline.add(fp)
                    budget -= v.size
                else:
                    uploads[fp] = v
        lists_items: list[list[dict[str, Any]]] = []
        for group in lists:
            items = []
            for entry, value in group:
                if value is None:
                    items.append(entry)
                elif value.fingerprint in inline:
                    items.append({**entry, "value": {"serde": value.serde, "data": value.data}})
                    inline.discard(value.fingerprint)  # a value repeated in one body travels once
                else:
                    items.append({**entry, "fingerprint": value.fingerprint})
            lists_items.append(items)
        plan.body = build(lists_items)
        plan.uploads = list(uploads.values())
        # Several chunks to send: ask first whether the server holds them already (another
        # process may have sent the same value).
        plan.ask = [fp for fp, v in uploads.items() if len(v.data) > self._chunk_chars][:_ASK_MAX]
        return plan

    def _release(self, plan: _Plan, *, stored: bool) -> None:
        with self._known_lock:
            if stored:
                self._remember(plan.named)
            for fp in plan.claimed:
                if self._inflight.get(fp) is plan.done:
                    del self._inflight[fp]
        plan.done.set()

    def _chunks(self, value: _Value) -> Iterator[dict[str, Any]]:
        n = self._chunk_chars
        pieces = [value.data[i:i + n] for i in range(0, len(value.data), n)] or [""]
        for index, piece in enumerate(pieces):
            yield {"fingerprint": value.fingerprint, "serde": value.serde, "index": index, "count": len(pieces),
                   "data": piece}

    def _plan_again(self, exc: GraphBlobMissing | PayloadTooLarge, plan: _Plan, retried: bool) -> bool:
        """After a refused send, whether to plan it again (re-raises ``exc`` when not): a value
        the server turned out not to hold is sent again once; a smaller body limit the server
        named is planned with. Returns the new ``retried``."""
        if isinstance(exc, GraphBlobMissing):
            if retried:
                raise exc
            self._forget(exc.details.get("missing") or plan.named)
            return True
        if not self._learn_limit(exc):
            raise exc
        return retried

    def _send(self, path: str, make: Callable[[bool], _Plan]) -> Any:
        """Upload what the plan needs, then send its body; a value the server turns out not to hold
        (forgotten by the server, or another server behind the URL) is sent again, once."""
        retried = False
        while True:
            plan = make(True)
            if plan.waits:
                self._release(plan, stored=False)
                for carrier in plan.waits:
                    carrier.wait(self._timeout)
                continue
            stored = False
            try:
                held = set(plan.ask) - set(self._call("POST", "/graph-blobs/missing",
                                                      json={"fingerprints": plan.ask})["missing"]) if plan.ask else set()
                for value in plan.uploads:
                    if value.fingerprint not in held:
                        for chunk in self._chunks(value):
                            if self._call("POST", "/graph-blobs", json=chunk)["complete"]:
                                break
                out = self._call("POST", path, json=plan.body, socket=True)
                stored = True
                return out
            except (GraphBlobMissing, PayloadTooLarge) as exc:
                retried = self._plan_again(exc, plan, retried)
            finally:
                self._release(plan, stored=stored)

    async def _asend(self, path: str, make: Callable[[bool], _Plan]) -> Any:
        """:meth:`_send` on the async client; it never blocks the loop waiting for another request
        (a value in flight elsewhere is sent along: the server stores it once)."""
        retried = False
        while True:
            plan = make(False)
            stored = False
            try:
                held = set(plan.ask) - set((await self._acall("POST", "/graph-blobs/missing",
                                                              json={"fingerprints": plan.ask}))["missing"]) \
                    if plan.ask else set()
                for value in plan.uploads:
                    if value.fingerprint not in held:
                        for chunk in self._chunks(value):
                            if (await self._acall("POST", "/graph-blobs", json=chunk))["complete"]:
                                break
                out = await self._acall("POST", path, json=plan.body, socket=True)
                stored = True
                return out
            except (GraphBlobMissing, PayloadTooLarge) as exc:
                retried = self._plan_again(exc, plan, retried)
            finally:
                self._release(plan, stored=stored)

    # ---- request builders and response readers (shared by sync and async) --------------------------
    def _put_plan(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                  new_versions: ChannelVersions, held: Sequence[_Held] = ()) -> Callable[[bool], _Plan]:
        conf = _configurable(config)
        document: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = document.pop("channel_values", {}) or {}
        versions = document.get("channel_versions") or {}
        inline = _inline_values(values, versions)
        sent = [(channel, version) for channel, version in new_versions.items() if channel not in inline]
        # An unchanged value that could be inline but found no room in this put goes as a blob:
        # an earlier put may have carried it inline, and the server keeps no version row of those.
        sent += [(channel, versions[channel]) for channel, value in values.items()
                 if channel not in inline and channel not in new_versions and _inlinable(channel, value, versions)]
        # Serialized once, planned on each attempt (what the server holds may change between them).
        entries: list[tuple[dict[str, Any], _Value | None]] = [
            ({"channel": channel, "version": version},
             self._value(values[channel]) if channel in values else _value_of("empty", ""))
            for channel, version in sent
        ]
        body = {
            "thread_id": str(conf["thread_id"]), "checkpoint_ns": conf.get("checkpoint_ns", ""),
            "checkpoint_id": checkpoint["id"], "parent_checkpoint_id": conf.get("checkpoint_id"),
            "checkpoint": _jsonable(document, "the checkpoint"),
            "metadata": _fitted_metadata(
                _jsonable(get_serializable_checkpoint_metadata(config, metadata), "checkpoint metadata"), metadata),
            "open": self.thread_spec.open_body(),
        }
        if inline:
            body["values"] = inline
        if not held:
            return lambda wait: self._plan(body, "blobs", entries, wait=wait)
        tasks = [{"checkpoint_id": h.checkpoint_id, "task_id": h.task_id, "task_path": h.task_path} for h in held]

        def build(items: list[list[dict[str, Any]]]) -> dict[str, Any]:
            *writes, blobs = items
            return {**body, "blobs": blobs, "writes": [{**t, "writes": w} for t, w in zip(tasks, writes)]}

        lists = [list(h.entries) for h in held] + [entries]
        return lambda wait: self._plan_lists(body, lists, build, wait=wait)

    def _stored(self, out: Mapping[str, Any]) -> RunnableConfig:
        if out.get("runtime_id"):
            self._hold(out["thread_id"], out["runtime_id"])
        return {"configurable": {"thread_id": out["thread_id"], "checkpoint_ns": out["checkpoint_ns"],
                                 "checkpoint_id": out["checkpoint_id"]}}

    def _write_entries(self, writes: Sequence[tuple[str, Any]]) -> list[tuple[dict[str, Any], _Value | None]]:
        """A task's writes as entries: a small scalar in the entry itself (``scalar``, up to
        :data:`_WRITE_SCALAR_SHARE` of the body limit; with LangGraph's own serializer only), any
        other value serialized, to be planned."""
        entries: list[tuple[dict[str, Any], _Value | None]] = []
        size, room = 0, self.max_body_bytes // _WRITE_SCALAR_SHARE
        for i, (channel, value) in enumerate(writes):
            entry = {"idx": WRITES_IDX_MAP.get(channel, i), "channel": channel}
            if self._scalar_writes and _kept_inline(channel, value):
                more = _json_bytes(value)
                if size + more <= room:
                    size += more
                    entries.append(({**entry, "scalar": value}, None))
                    continue
            entries.append((entry, self._value(value)))
        return entries

    def _task_writes_plan(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str, task_path: str,
                          entries: list[tuple[dict[str, Any], _Value | None]]) -> Callable[[bool], _Plan]:
        """A ``POST /graph-threads/writes`` of one task's writes (sent now, or held ones sent on their own)."""
        body = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id,
                "task_id": task_id, "task_path": task_path, "open": self.thread_spec.open_body()}
        return lambda wait: self._plan(body, "writes", entries, wait=wait)

    def _tuple(self, item: Mapping[str, Any]) -> CheckpointTuple:
        document = {k: v for k, v in item["checkpoint"].items() if k != "blobs"}
        # The values put inline (the checkpoint's own ``channel_values``), then the blobs.
        document["channel_values"] = {
            **(document.get("channel_values") or {}),
            **{channel: self._load(blob) for channel, blob in item["blobs"].items() if blob["serde"] != "empty"},
        }
        writes = sorted(item["pending_writes"], key=lambda w: writes_sort_key(w["task_path"], w["task_id"], w["idx"]))
        config: RunnableConfig = {"configurable": {"thread_id": item["thread_id"], "checkpoint_ns": item["checkpoint_ns"],
                                                   "checkpoint_id": item["checkpoint_id"]}}
        parent: RunnableConfig | None = None
        if item.get("parent_checkpoint_id"):
            parent = {"configurable": {"thread_id": item["thread_id"], "checkpoint_ns": item["checkpoint_ns"],
                                       "checkpoint_id": item["parent_checkpoint_id"]}}
        return CheckpointTuple(
            # the server answers the checkpoint's own fields (its blobs loaded above)
            config=config, checkpoint=cast("Checkpoint", document), metadata=item["metadata"], parent_config=parent,
            pending_writes=[(w["task_id"], w["channel"], self._load_write(w)) for w in writes],
        )

    @staticmethod
    def _list_params(config: RunnableConfig | None, *, filter: dict[str, Any] | None, before: RunnableConfig | None,
                     limit: int | None) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if config is not None:
            conf = _configurable(config)
            if conf.get("thread_id") is not None:
                params["thread_id"] = str(conf["thread_id"])
            if conf.get("checkpoint_ns") is not None:
                params["checkpoint_ns"] = conf["checkpoint_ns"]
            if conf.get("checkpoint_id"):
                params["checkpoint_id"] = conf["checkpoint_id"]
        if filter:
            params["metadata"] = json.dumps(_jsonable(filter, "the metadata filter"))
        if before is not None and get_checkpoint_id(before):
            params["before"] = get_checkpoint_id(before)
        params["limit"] = min(limit, PAGE_MAX) if limit is not None else PAGE_MAX
        return params

    @staticmethod
    def _get_params(config: RunnableConfig) -> dict[str, Any]:
        conf = _configurable(config)
        params = {"thread_id": str(conf["thread_id"]), "checkpoint_ns": conf.get("checkpoint_ns", ""), "limit": 1}
        if get_checkpoint_id(config):
            params["checkpoint_id"] = get_checkpoint_id(config)
        return params

    # ---- BaseCheckpointSaver: sync -------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._raise_if_lost(config)
        self._flush_held()  # a read sees every write this saver was given
        items = self._call("GET", "/graph-threads/checkpoints", params=self._get_params(config))["items"]
        return self._tuple(items[0]) if items else None

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        if limit is not None and limit <= 0:
            return  # nothing asked for (the server refuses a page size below 1)
        self._flush_held()
        params = self._list_params(config, filter=filter, before=before, limit=limit)
        remaining = limit
        while True:
            items = self._call("GET", "/graph-threads/checkpoints", params=params)["items"]
            for item in items:
                yield self._tuple(item)
            if remaining is not None:
                remaining -= len(items)
                if remaining <= 0:
                    return
            if len(items) < params["limit"]:
                return
            params = {**params, "before": items[-1]["checkpoint_id"],
                      "limit": min(remaining, PAGE_MAX) if remaining is not None else PAGE_MAX}

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        self._raise_if_lost(config)
        self._stop_if_aborted(config)
        self._continue_if_waiting(config)
        conf = _configurable(config)
        alone, held = self._take_held((str(conf["thread_id"]), conf.get("checkpoint_ns", "")))
        if alone:  # more than a put carries: the first ones go on their own, first
            try:
                self._send_held(alone)
            except BaseException:
                self._hold_again([*alone, *held])  # a write sent twice is stored once
                raise
        try:
            out = self._send("/graph-threads/checkpoints",
                             self._put_plan(config, checkpoint, metadata, new_versions, held))
        except BaseException:
            # The put was refused or its fate is unknown: the writes it carried are stored on
            # their own (a write stored twice is stored once), then its error stands; writes that
            # cannot be sent now either are held again, for the next put, read or close.
            try:
                self._send_held(held)
            except Exception:  # noqa: BLE001 — the put's own error is the one to raise
                self._hold_again(held)
            raise
        return self._stored(out)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        self._raise_if_lost(config)
        self._stop_if_aborted(config)
        parts = self._task_parts(config, writes, task_id, task_path)
        if self._held_for_the_put(parts, writes):
            return
        self._flush_held()  # what was held first reaches the server first
        self._send_held(parts)
        for channel, value in writes:
            if channel == INTERRUPT:
                self._on_interrupt(config, value)

    # ---- held writes ---------------------------------------------------------------------------------
    def _task_parts(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                    task_path: str) -> builtins.list[_Held]:  # `list` is a method here
        """A task's writes in parts of at most :data:`_TASK_WRITES` (one part when it has none)."""
        conf = _configurable(config)
        entries, now = self._write_entries(writes), time.monotonic()
        return [_Held(now, str(conf["thread_id"]), conf.get("checkpoint_ns", ""), conf["checkpoint_id"], task_id,
                      task_path, entries[i:i + _TASK_WRITES]) for i in range(0, max(len(entries), 1), _TASK_WRITES)]

    def _held_for_the_put(self, parts: Sequence[_Held], writes: Sequence[tuple[str, Any]]) -> bool:
        """Hold a task's ordinary writes (no special channel) for the put that follows them
        (LangGraph's sync durability waits for that put, which stores them first, in its own
        transaction); False when they go now (``put_writes``/``aput_writes`` send them)."""
        if not (self.hold_writes and writes and all(channel not in WRITES_IDX_MAP for channel, _ in writes)):
            return False
        with self._held_lock:
            for item in parts:
                self._held.setdefault((item.thread_id, item.checkpoint_ns), []).append(item)
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_late, name="novelforge-saver-writes",
                                                 daemon=True)
                self._flusher.start()
        return True

    def _take_held(self, key: tuple[str, str]) -> tuple[builtins.list[_Held], builtins.list[_Held]]:
        """The writes held for a put of thread ``key``, taken: those it sends on their own first,
        and those it carries (the latest, at most :data:`_PUT_TASKS` of them, within a
        :data:`_PUT_WRITES_SHARE` of the body limit)."""
        with self._held_lock:
            held = self._held.pop(key, [])
        room, n = self.max_body_bytes // _PUT_WRITES_SHARE, 0
        for item in reversed(held):
            if n == _PUT_TASKS or item.size > room:
                break
            room -= item.size
            n += 1
        return held[:len(held) - n], held[len(held) - n:]

    def _send_held(self, held: Sequence[_Held]) -> None:
        """Held writes on their own, one request per task (or part of one), in the order they were held."""
        for item in held:
            self._send("/graph-threads/writes", self._task_writes_plan(
                item.thread_id, item.checkpoint_ns, item.checkpoint_id, item.task_id, item.task_path, item.entries))

    def _take_due(self, older_than: float | None = None) -> builtins.list[_Held]:  # `list` is a method here
        """Every held write taken out (``older_than``: only those held before that monotonic time)."""
        with self._held_lock:
            taken: list[_Held] = []
            for key, items in list(self._held.items()):
                keep = [h for h in items if older_than is not None and h.at >= older_than]
                taken += items[:len(items) - len(keep)]  # held in order: the due ones come first
                if keep:
                    self._held[key] = keep
                else:
                    del self._held[key]
        return taken

    def _flush_held(self, older_than: float | None = None) -> None:
        """Send every held write (``older_than``: only those held before that monotonic time)."""
        taken = self._take_due(older_than)
        try:
            self._send_held(taken)
        except BaseException:
            self._hold_again(taken)  # a write stored twice is stored once: the next put, read or close resends
            raise

    async def _asend_held(self, held: Sequence[_Held]) -> None:
        """:meth:`_send_held` on the async client."""
        for item in held:
            await self._asend("/graph-threads/writes", self._task_writes_plan(
                item.thread_id, item.checkpoint_ns, item.checkpoint_id, item.task_id, item.task_path, item.entries))

    async def _aflush_held(self) -> None:
        """:meth:`_flush_held` on the async client: every held write sent, or held again."""
        if not self._held:
            return
        taken = self._take_due()
        try:
            await self._asend_held(taken)
        except BaseException:
            self._hold_again(taken)  # a write stored twice is stored once: the next put, read or close resends
            raise

    def _hold_again(self, items: Sequence[_Held]) -> None:
        """Writes that could not be sent, held again ahead of any held since."""
        with self._held_lock:
            for item in reversed(items):
                key = (item.thread_id, item.checkpoint_ns)
                self._held[key] = [item, *self._held.get(key, [])]

    def _flush_late(self) -> None:
        """The saver's one background thread: sends writes no put came for within ``hold_seconds``."""
        while not self._closed.wait(self.hold_seconds / 2):
            try:
                self._flush_held(older_than=time.monotonic() - self.hold_seconds)
            except Exception:  # noqa: BLE001 — held again: the graph's next put, read or close sends them (or raises)
                pass

    def delete_thread(self, thread_id: str) -> None:
        self._flush_held()
        self._call("DELETE", "/graph-threads", params={"thread_id": str(thread_id)})
        self._let_go(str(thread_id))

    # ---- copy, prune, delete for runs (LangGraph's extended capabilities) -------------------------------
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread's history into a new thread: a new session (the source session's spec,
        runtime generation 1, run 1) holding every checkpoint and pending write of the source; the
        values are shared by fingerprint, never sent again. A target id the project has already is
        ``GraphThreadExists``; a source this token does not reach is ``NotFound`` (nothing written)."""
        self._flush_held()  # the copy holds every write this saver was given
        self._copied(self._call("POST", "/graph-threads/copy", json=self._copy_body(source_thread_id, target_thread_id)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """LangGraph's ``prune``: ``keep_latest`` keeps each namespace's latest checkpoint and its
        pending writes; ``delete`` removes every checkpoint. Each thread's session records what went."""
        self._flush_held()
        for body in self._prune_bodies(thread_ids, strategy):
            self._call("POST", "/graph-threads/prune", json=body)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """LangGraph's ``delete_for_runs``: the checkpoints whose metadata ``run_id`` is listed, with
        their pending writes, in every thread this token reaches."""
        self._flush_held()
        for body in self._runs_bodies(run_ids):
            self._call("POST", "/graph-threads/delete-for-runs", json=body)

    @staticmethod
    def _copy_body(source_thread_id: str, target_thread_id: str) -> dict[str, Any]:
        return {"source_thread_id": str(source_thread_id), "target_thread_id": str(target_thread_id)}

    def _copied(self, out: Mapping[str, Any]) -> None:
        # The copy's session was opened with a runtime of its own, held by this saver: heartbeaten.
        if out.get("runtime_id"):
            self._hold(out["thread_id"], out["runtime_id"])

    @staticmethod
    def _prune_bodies(thread_ids: Sequence[str], strategy: str) -> builtins.list[dict[str, Any]]:
        # At most _IDS_MAX ids per request (the server's bound), each request its own transaction.
        ids = [str(t) for t in thread_ids]
        return [{"thread_ids": ids[i:i + _IDS_MAX], "strategy": strategy} for i in range(0, len(ids), _IDS_MAX)]

    @staticmethod
    def _runs_bodies(run_ids: Sequence[str]) -> builtins.list[dict[str, Any]]:
        ids = [str(r) for r in run_ids]
        return [{"run_ids": ids[i:i + _IDS_MAX]} for i in range(0, len(ids), _IDS_MAX)]

    # ---- BaseCheckpointSaver: async ------------------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._raise_if_lost(config)
        await self._aflush_held()  # a read sees every write this saver was given
        items = (await self._acall("GET", "/graph-threads/checkpoints", params=self._get_params(config)))["items"]
        return self._tuple(items[0]) if items else None

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        if limit is not None and limit <= 0:
            return  # nothing asked for (the server refuses a page size below 1)
        await self._aflush_held()
        params = self._list_params(config, filter=filter, before=before, limit=limit)
        remaining = limit
        while True:
            items = (await self._acall("GET", "/graph-threads/checkpoints", params=params))["items"]
            for item in items:
                yield self._tuple(item)
            if remaining is not None:
                remaining -= len(items)
                if remaining <= 0:
                    return
            if len(items) < params["limit"]:
                return
            params = {**params, "before": items[-1]["checkpoint_id"],
                      "limit": min(remaining, PAGE_MAX) if remaining is not None else PAGE_MAX}

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        self._raise_if_lost(config)
        if self._aborts or self._aborted:
            await asyncio.to_thread(self._stop_if_aborted, config)
        conf = _configurable(config)
        if str(conf.get("thread_id")) in self._waiting_on_user:
            await asyncio.to_thread(self._continue_if_waiting, config)
        alone, held = self._take_held((str(conf["thread_id"]), conf.get("checkpoint_ns", "")))
        if alone:  # as put: the first ones on their own, first
            try:
                await self._asend_held(alone)
            except BaseException:
                self._hold_again([*alone, *held])
                raise
        try:
            out = await self._asend("/graph-threads/checkpoints",
                                    self._put_plan(config, checkpoint, metadata, new_versions, held))
        except asyncio.CancelledError:
            self._hold_again(held)  # nothing more is awaited once cancelled: the next put, read or close sends them
            raise
        except BaseException:
            # As put: the writes it carried are stored on their own, then its error stands.
            try:
                await self._asend_held(held)
            except Exception:  # noqa: BLE001 — the put's own error is the one to raise
                self._hold_again(held)
            raise
        return self._stored(out)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        self._raise_if_lost(config)
        if self._aborts or self._aborted:
            await asyncio.to_thread(self._stop_if_aborted, config)
        parts = self._task_parts(config, writes, task_id, task_path)
        if self._held_for_the_put(parts, writes):
            return
        await self._aflush_held()  # what was held first reaches the server first
        await self._asend_held(parts)
        for channel, value in writes:
            if channel == INTERRUPT:
                # The wait's requests are few and rare: run them off the loop with the sync client.
                await asyncio.to_thread(self._on_interrupt, config, value)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._aflush_held()
        await self._acall("DELETE", "/graph-threads", params={"thread_id": str(thread_id)})
        self._let_go(str(thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._aflush_held()
        self._copied(await self._acall("POST", "/graph-threads/copy",
                                       json=self._copy_body(source_thread_id, target_thread_id)))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._aflush_held()
        for body in self._prune_bodies(thread_ids, strategy):
            await self._acall("POST", "/graph-threads/prune", json=body)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._aflush_held()
        for body in self._runs_bodies(run_ids):
            await self._acall("POST", "/graph-threads/delete-for-runs", json=body)

    # ---- the thread's session: interrupts, gates, resume -------------------------------------------------
    def session_of(self, thread_id: str) -> dict[str, Any]:
        """The thread's session (``GET /sessions/{id}``)."""
        thread = self._call("GET", "/graph-threads", params={"thread_id": str(thread_id)})
        return self._call("GET", f"/sessions/{thread['session_id']}")

    def _runtime_param(self, thread_id: str) -> dict[str, Any]:
        runtime_id = self.runtimes.get(thread_id)
        return {"runtime_id": runtime_id} if runtime_id else {}

    def _on_interrupt(self, config: RunnableConfig, value: Any) -> None:
        """The graph paused: record the wait on the session (a gate, or ``awaiting_user``)."""
        conf = _configurable(config)
        thread_id = str(conf["thread_id"])
        interrupts = value if isinstance(value, (list, tuple)) else [value]
        landed = self._await_landed(config)
        session = self.session_of(thread_id)
        run_id = self._open_run_id(session["id"])
        gates: list[dict[str, Any]] = []
        for item in interrupts:
            payload = getattr(item, "value", item)
            if isinstance(payload, Mapping) and REVIEW_GATE_KEY in payload:
                gates.append(self._gate_for(session, dict(payload[REVIEW_GATE_KEY]), thread_id))
        if not gates and session["status"] == "running":
            self._call("POST", f"/sessions/{session['id']}/transition",
                       json={"to": "awaiting_user", "reason": "graph interrupted: waiting for input",
                             **self._runtime_param(thread_id)})
            self._waiting_on_user.add(thread_id)
        if run_id is not None:
            waits_on_user = not gates or any(g["route"] != "agent" for g in gates)
            cursor = {"graph": {"checkpoint_ns": conf.get("checkpoint_ns", ""), "checkpoint_id": conf["checkpoint_id"],
                                "interrupted": True}}
            # The wait binds what the graph had (its state blobs) and what the gates review (their
            # candidates): resume verifies every fingerprint before the graph continues.
            refs = {(r["artifact_id"], r["fingerprint"])
                    for r in self._call("GET", f"/checkpoints/{landed['record_id']}")["artifacts"]}
            for gate in gates:
                version = self._call("GET", f"/artifact-versions/{gate['candidate_version_id']}")
                refs.add((version["artifact_id"], version["fingerprint"]))
            body: dict[str, Any] = {
                "boundary": "user_wait" if waits_on_user else "external_wait", "cursor": cursor,
                "artifacts": [{"artifact_id": a, "fingerprint": fp} for a, fp in sorted(refs)],
            }
            if gates:
                body["pending"] = {"gates": [{"gate_id": g["id"]} for g in gates]}
            self._call("POST", f"/runs/{run_id}/checkpoints", json=body)

    def _continue_if_waiting(self, config: RunnableConfig) -> None:
        """The graph was resumed in this process after a plain interrupt: the waiting run continues
        (``awaiting_user → running``). A resume from another process goes through :meth:`resume`."""
        thread_id = str(_configurable(config).get("thread_id"))
        if thread_id not in self._waiting_on_user:
            return
        self._waiting_on_user.discard(thread_id)
        session = self.session_of(thread_id)
        if session["status"] == "awaiting_user":
            self._call("POST", f"/sessions/{session['id']}/transition",
                       json={"to": "running", "reason": "graph resumed with the user's input",
                             **self._runtime_param(thread_id)})

    def _await_landed(self, config: RunnableConfig, timeout: float = 15.0) -> dict[str, Any]:
        """LangGraph stores checkpoints in the background: the interrupt's write can overtake the
        put of the checkpoint it follows. The wait is recorded after that checkpoint, so that
        resuming starts from the wait (and revalidates what it waits on)."""
        deadline = time.monotonic() + timeout
        while True:
            items = self._call("GET", "/graph-threads/checkpoints", params=self._get_params(config))["items"]
            if items:
                return items[0]
            if time.monotonic() >= deadline:
                raise TimeoutError(f"checkpoint {get_checkpoint_id(config)} was not stored within {timeout} s")
            time.sleep(0.05)

    def _open_run_id(self, session_id: int) -> int | None:
        runs = self._call("GET", f"/sessions/{session_id}/runs", params={"state": "open"})["items"]
        return runs[-1]["id"] if runs else None

    def _gate_for(self, session: Mapping[str, Any], spec: dict[str, Any], thread_id: str) -> dict[str, Any]:
        """Open the gate, unless this session already has a pending gate on that candidate (a retried write)."""
        gates = self._call("GET", f"/sessions/{session['id']}/review-gates", params={"limit": PAGE_MAX})["items"]
        for gate in gates:
            if gate["state"] == "pending" and gate["candidate_version_id"] == spec.get("candidate_version_id"):
                return gate
        return self._call("POST", f"/sessions/{session['id']}/review-gates", json={**spec, **self._runtime_param(thread_id)})

    def pending_gates(self, thread_id: str) -> builtins.list[dict[str, Any]]:  # `list` is a method here
        session = self.session_of(thread_id)
        gates = self._call("GET", f"/sessions/{session['id']}/review-gates", params={"limit": PAGE_MAX})["items"]
        return [g for g in gates if g["state"] == "pending"]

    def wait_for_gate(self, gate_id: int, *, timeout: float = 60.0, interval: float = 0.2) -> dict[str, Any]:
        """Poll the gate until it is no longer pending; returns it with its verdicts."""
        deadline = time.monotonic() + timeout
        while True:
            gate = self._call("GET", f"/review-gates/{gate_id}")
            if gate["state"] != "pending":
                return gate
            if time.monotonic() >= deadline:
                raise TimeoutError(f"review gate {gate_id} is still pending after {timeout} s")
            time.sleep(interval)

    def resume(self, thread_id: str, *, capabilities: Sequence[str] = (), dry_run: bool = False,
               checkpoint_id: int | None = None) -> dict[str, Any]:
        """Resume the thread's session: the revalidation report, then (unless ``dry_run``) runtime
        generation N+1 and a new run for the graph's next checkpoints. A refused resume raises
        :class:`novelforge_client.errors.ResumeRefused` whose ``details["report"]`` names the failed steps."""
        session = self.session_of(thread_id)
        body: dict[str, Any] = {"runtime": {"runtime_family": self.thread_spec.runtime_family,
                                            "capabilities": list(capabilities or self.thread_spec.capabilities)},
                                "dry_run": dry_run}
        if self.thread_spec.lease_seconds:
            body["runtime"]["lease_seconds"] = self.thread_spec.lease_seconds
        if checkpoint_id is not None:
            body["checkpoint_id"] = checkpoint_id
        report = self._call("POST", f"/sessions/{session['id']}/resume", json=body)
        if not dry_run and report.get("runtime_id"):
            self._hold(str(thread_id), report["runtime_id"])
        return report

    def heartbeat(self, thread_id: str) -> dict[str, Any]:
        """Renew the lease of the runtime this saver holds for the thread, now (the saver's
        background thread does so every third of the lease), for the lease it was attached with."""
        runtime_id = self.runtimes[str(thread_id)]
        lease = self._leases.get(str(thread_id))
        seconds = lease.lease_seconds if lease is not None and lease.runtime_id == runtime_id else None
        seconds = seconds or self.thread_spec.lease_seconds
        return self._call("POST", f"/runtimes/{runtime_id}/heartbeat",
                          json={"lease_seconds": seconds} if seconds else {})

    def release(self, thread_id: str) -> dict[str, Any]:
        """Close the thread session's live runtime (the graph process is going away; a waiting
        session keeps waiting)."""
        session = self.session_of(thread_id)
        out = self._call("POST", f"/sessions/{session['id']}/close",
                         json={"reason": "graph released", **self._runtime_param(str(thread_id))})
        self._let_go(str(thread_id))
        return out

    # ---- the background heartbeat ------------------------------------------------------------------------
    def _hold(self, thread_id: str, runtime_id: int) -> None:
        """The saver holds the thread's runtime (it opened the thread, or resumed it): heartbeat it."""
        with self._lease_lock:
            self.runtimes[thread_id] = runtime_id
            self._lost.pop(thread_id, None)
            self._aborts.pop(thread_id, None)
            self._aborted.pop(thread_id, None)
            self._aborted.pop(thread_id, None)
            if not self.heartbeats:
                return
            seconds = self.thread_spec.lease_seconds  # None: the server's default, asked of the server first
            now = time.monotonic()
            self._leases[thread_id] = _Lease(thread_id, runtime_id, seconds,
                                             now + seconds * HEARTBEAT_FRACTION if seconds else now, now)
            if self._beater is None and not self._closed.is_set():
                self._beater = threading.Thread(target=self._beat_loop, name="novelforge-saver-heartbeat",
                                                daemon=True)
                self._beater.start()
        self._wake.set()

    def _let_go(self, thread_id: str) -> None:
        """The thread is deleted or released: no more heartbeats, nothing to raise."""
        with self._lease_lock:
            self.runtimes.pop(thread_id, None)
            self._leases.pop(thread_id, None)
            self._lost.pop(thread_id, None)
            self._aborts.pop(thread_id, None)

    def lease_lost(self, thread_id: str) -> LeaseLost | None:
        """Why the runtime this saver held for the thread is no longer live (None: it is, or the
        saver holds none). The thread's next put, write or read raises it, until :meth:`resume`."""
        return self._lost.get(str(thread_id))

    def abort_requested(self, thread_id: str) -> bool:
        """A heartbeat said a manager asked the thread's run to stop: its next put or write ends the
        run ``aborted`` and raises :class:`RunAborted`, as does every one after it until the thread
        is released or resumed."""
        thread_id = str(thread_id)
        return thread_id in self._aborts or thread_id in self._aborted

    def _stop_if_aborted(self, config: RunnableConfig) -> None:
        """A run a manager asked to stop is ended ``aborted`` (once, as the runtime holding it)
        before the thread's next put or write, which is not sent: :class:`RunAborted` instead."""
        thread_id = str(_configurable(config).get("thread_id"))
        with self._lease_lock:
            asked = self._aborts.pop(thread_id, None)
            if asked is not None:
                self._aborted[thread_id] = asked
            run_id = self._aborted.get(thread_id)
            runtime_id = self.runtimes.get(thread_id)
        if run_id is None:
            return
        if asked is not None:
            body: dict[str, Any] = {"outcome": "aborted", "reason": "abort requested"}
            if runtime_id is not None:
                body["runtime_id"] = runtime_id
            try:
                self._call("POST", f"/runs/{asked}/end", json=body)
            except Conflict as exc:  # ended meanwhile (closed, failed, ended by hand): nothing left to end
                log.info("graph thread %r: run %s asked to abort was already over (%s)", thread_id, asked, exc.code)
            log.warning("graph thread %r: run %s ended aborted, as a manager asked", thread_id, asked)
        raise RunAborted(f"a manager asked run {run_id} of graph thread {thread_id!r} to stop: it was ended "
                         "aborted; release and resume the thread to go on", thread_id=thread_id, run_id=run_id)

    def beats(self, thread_id: str) -> int:
        """Heartbeats the server acknowledged for the runtime the saver holds for the thread."""
        lease = self._leases.get(str(thread_id))
        return lease.beats if lease is not None else 0

    def _raise_if_lost(self, config: RunnableConfig) -> None:
        lost = self._lost.get(str(_configurable(config).get("thread_id")))
        if lost is not None:
            raise LeaseLost(lost.message, thread_id=lost.thread_id, runtime_id=lost.runtime_id,
                            cause=lost.cause) from lost.cause

    def _beat_loop(self) -> None:
        """The saver's heartbeat thread: one for every runtime it holds, sync and async alike."""
        while not self._closed.is_set():
            self._wake.clear()  # a runtime held from now on wakes the wait below
            now = time.monotonic()
            with self._lease_lock:
                for thread_id, lease in list(self._leases.items()):
                    if self.runtimes.get(thread_id) != lease.runtime_id:
                        del self._leases[thread_id]  # let go (or replaced) outside _hold/_let_go
                for thread_id, runtime_id in list(self.runtimes.items()):  # a copy: written elsewhere too
                    if thread_id not in self._leases:
                        self._leases[thread_id] = _Lease(thread_id, runtime_id, None, now, now)
                due = [lease for lease in self._leases.values() if lease.due <= now]
                after = min((lease.due for lease in self._leases.values()), default=None)
            for lease in due:
                if self._closed.is_set():
                    return
                self._beat(lease)
            if not due:
                self._wake.wait(None if after is None else max(0.0, after - time.monotonic()))

    def _beat(self, lease: _Lease) -> None:
        try:
            if lease.lease_seconds is None:  # the lease it was attached with: the first beat is due a third into it
                lease.lease_seconds = int(self._call("GET", f"/runtimes/{lease.runtime_id}")["lease_seconds"])
                lease.due = lease.since + lease.interval
                if lease.due > time.monotonic():
                    return
            beat = self._call("POST", f"/runtimes/{lease.runtime_id}/heartbeat",
                              json={"lease_seconds": lease.lease_seconds})
        except _LOST as exc:
            self._lose(lease, exc)
            return
        except Exception as exc:  # noqa: BLE001 — the network or the server: tried again at the next interval
            log.warning("heartbeat of runtime %s (graph thread %r) failed, tried again in %.1f s: %s",
                        lease.runtime_id, lease.thread_id, lease.interval, exc)
        else:
            lease.beats += 1
            if beat.get("abort_requested") and beat.get("open_run_id"):
                self._abort_asked(lease, int(beat["open_run_id"]))
        lease.due = time.monotonic() + lease.interval

    def _abort_asked(self, lease: _Lease, run_id: int) -> None:
        with self._lease_lock:
            if (self.runtimes.get(lease.thread_id) != lease.runtime_id or self._aborts.get(lease.thread_id) == run_id
                    or self._aborted.get(lease.thread_id) == run_id):
                return  # let go meanwhile, already known, or already ended (a late beat's flag is old news)
            self._aborts[lease.thread_id] = run_id
        log.warning("graph thread %r: a manager asked run %s to stop; its next put or write ends it aborted "
                    "and raises RunAborted", lease.thread_id, run_id)

    def _lose(self, lease: _Lease, exc: NovelForgeError) -> None:
        with self._lease_lock:
            if self.runtimes.get(lease.thread_id) != lease.runtime_id:
                return  # let go meanwhile (deleted, released, resumed): nothing was lost
            del self.runtimes[lease.thread_id]
            self._leases.pop(lease.thread_id, None)
            self._lost[lease.thread_id] = LeaseLost(
                f"the runtime {lease.runtime_id} of graph thread {lease.thread_id!r} is no longer live ({exc.code}): "
                "resume the thread to continue", thread_id=lease.thread_id, runtime_id=lease.runtime_id, cause=exc)
        log.warning("graph thread %r lost its runtime %s (%s: %s); its next put, write or read raises LeaseLost",
                    lease.thread_id, lease.runtime_id, exc.code, exc.message)
