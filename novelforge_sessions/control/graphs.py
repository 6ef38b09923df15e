"""Graph threads: a graph runtime's thread is a session, its checkpoints are our bounded checkpoints.

Built for LangGraph's checkpointer interface (``novelforge_client.langgraph``), in its terms:

* a **thread** (``thread_id``) is a session (:class:`GraphThread`), opened on the thread's first
  checkpoint with runtime generation 1 and run 1, exactly as an agent would open one;
* a **checkpoint** is one :class:`Checkpoint` (bounded: boundary ``context_freeze``, a cursor
  naming the graph checkpoint, and the fingerprints of the state blobs) plus its graph index row
  (:class:`GraphCheckpoint`: graph ids, namespace, metadata, channel versions);
* a **state blob** (one channel value, serialized by the graph) is an artifact named by its own
  content fingerprint (``blob:sha256:…``, kind ``graph-blob``, one immutable version): the same
  value is stored once per project, and the checkpoint stays bounded however large the state;
* a **pending write** (``put_writes``) is a :class:`GraphWrite` beside the immutable checkpoint
  (keyed by the graph checkpoint id: it may arrive before the checkpoint has landed),
  its value a blob too, or a small scalar kept in its own row; ``(task_id, idx)`` is stored once
  (LangGraph's special channels, negative ``idx``, keep their latest value);
* **deleting a thread** closes the session's live runtime and forgets the session (its runs,
  checkpoints and graph rows); its blobs stay until garbage collection finds nothing citing them
  (``control/graph_gc.py``, a step of every reconciler pass);
* **copying a thread** opens a new session (the source's spec) whose run 1 holds a copy of the
  source's history, blobs shared by fingerprint; **pruning** (``keep_latest``: each namespace's
  latest checkpoint and its writes stay; ``delete``) and **deleting for runs** remove graph
  checkpoints with their bounded checkpoints, writes and unnamed channel versions, and say so in
  the session's timeline (their blobs, too, are left to garbage collection).

**Citing a blob locks it.** Every statement here that resolves a blob to cite it (a put's
channels, a task's writes) locks the blob's artifact row ``FOR KEY SHARE`` until its transaction
commits; garbage collection locks a blob ``FOR UPDATE SKIP LOCKED`` and only then asks, in a new
snapshot, whether anything cites it. So a blob is collected only when no committed row cites it
and no writer in flight has resolved it; a writer that resolves it after it was collected finds
it missing (an inline value is stored again, a fingerprint is ``409 graph_blob_missing``).

Resuming a thread is resuming its session (``control/resume.py``): the revalidation report
decides, then generation N+1 and a new run take the thread's next checkpoints.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q, QuerySet

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import TOKEN_STILL_VALID_SQL, Caller, recheck_params, token_confirmed
from novelforge_sessions.actions import runs as run_actions
from novelforge_sessions.actions import sessions as session_actions
from novelforge_sessions import commit, events
from novelforge_sessions import event_types as ev
from novelforge_sessions.actions.lifecycle import Outbox, check, live_runtime, lock_session
from novelforge_sessions.actions.runtimes import MAX_LEASE_SECONDS, RuntimeSpec
from novelforge_sessions.control.checkpoints import Beside, ResolvedRefs, record_checkpoint
from novelforge_sessions.control.fingerprints import canonical_json
from novelforge_sessions.control.models import GraphBlob, GraphBlobChunk, GraphCheckpoint, GraphThread, GraphWrite
from novelforge_sessions.errors import (
    GraphBlobMismatch, GraphBlobMissing, GraphCheckpointConflict, GraphThreadExists, NoOpenRun, NotFound, ServiceError,
    Unauthorized, ValidationFailed,
)
from novelforge_sessions.models import (
    GRAPH_BLOB_KIND, Artifact, ArtifactVersion, Checkpoint, Run, RuntimeAttachment, Session, content_fingerprint,
)

#: The artifact kind of state blobs (reserved: ``models.GRAPH_BLOB_KIND``), and the prefix of
#: their names (``blob:<fingerprint>``).
BLOB_KIND = GRAPH_BLOB_KIND
BLOB_PREFIX = "blob:"
#: Bounds of the graph's own bookkeeping (the checkpoint document without values; metadata).
MAX_METADATA_BYTES = 16 * 1024
MAX_ID_LENGTH = 64
MAX_NAME_LENGTH = 200
#: A thread id, a checkpoint namespace or a task path: at most this many characters, and as many
#: bytes as UTF-8. LangGraph builds a subgraph's namespace from its parents' node names and task
#: ids (``outer_node:<task id>|inner_node:<task id>``), 37 characters more than the node's name
#: per level of nesting: a graph four subgraphs deep with descriptive node names passes 200. In
#: bytes so that a row's unique key stays well within what a PostgreSQL index entry holds.
MAX_PATH_LENGTH = 1000
#: A channel version (LangGraph's ``new_versions``) is stored as its JSON text in 100 characters
#: (``GraphBlob.version``). Declared in the API schema from these, and measured as declared: a
#: number (integer or not) within a bigint's range, whose JSON text is at most 24 characters; or
#: a string of at most 98 printable ASCII characters other than ``"`` and ``\`` (which JSON would
#: escape), so its JSON text is the string in quotes.
MIN_VERSION_NUMBER = -(2**63)
MAX_VERSION_NUMBER = 2**63 - 1
MAX_VERSION_LENGTH = 98
VERSION_TEXT_PATTERN = r"^[ !#-\[\]-~]*$"
_VERSION_TEXT_RE = re.compile(VERSION_TEXT_PATTERN)
_FINGERPRINT_RE = re.compile(rt.FINGERPRINT_PATTERN)
#: A state blob (one channel value or pending write) holds at most this many serialized bytes,
#: so a thread's state of up to 10 MiB is saved; its base64 text is at most MAX_BLOB_DATA_CHARS.
MAX_BLOB_BYTES = 10 * 1024 * 1024
MAX_BLOB_DATA_CHARS = 4 * math.ceil(MAX_BLOB_BYTES / 3)
#: A blob larger than one request body is uploaded in chunks of at most this many base64
#: characters (a multiple of 4, so each chunk is base64 by itself): with the request's other
#: fields a chunk's body stays under the API's default body limit (256 KiB, ``bodylimit.py``).
MAX_CHUNK_CHARS = 192 * 1024
MAX_CHUNKS = math.ceil(MAX_BLOB_DATA_CHARS / MAX_CHUNK_CHARS)
#: Staged chunks of an upload that never completed are dropped after this long (by the next
#: upload of the project that starts): staging holds no abandoned upload forever.
STALE_CHUNK_SECONDS = 24 * 3600
#: How many fingerprints one ``POST /graph-blobs/missing`` asks about.
MAX_ASKED_FINGERPRINTS = 500
#: A channel whose value is a small JSON scalar (``null``, a boolean, an integer of at most
#: 2**53 in magnitude, a string of at most MAX_INLINE_CHARS characters) may be put inline, in the
#: checkpoint itself (``put_checkpoint(values=…)``), as LangGraph's own PostgreSQL saver keeps
#: primitive values in its checkpoint row: no blob, no channel version row, no artifact ref. At
#: most MAX_INLINE_VALUES_BYTES of them per put (their compact JSON, ``json_size``).
MAX_INLINE_INT = 2**53
MAX_INLINE_CHARS = 256
MAX_INLINE_VALUES_BYTES = 16 * 1024


@dataclass(frozen=True)
class Blob:
    """A serialized value: the graph serializer's type tag and the bytes, base64-encoded."""

    serde: str
    data: str

    def content(self) -> str:
        return blob_content(self.serde, self.data)

    def fingerprint(self) -> str:
        return content_fingerprint(self.content().encode())


def blob_content(serde: str, data: str) -> str:
    """A blob's stored content, whose sha256 is its fingerprint (the client computes the same)."""
    return json.dumps({"serde": serde, "data": data}, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class ThreadSpec:
    """How to open the session of a new thread (its first checkpoint opens it)."""

    role: str = rt.SessionRole.SPECIALIST.value
    memory_policy: str = rt.MemoryPolicy.CHECKPOINT_ONLY.value
    task_mode: str = "langgraph"
    runtime_family: str = "langgraph"
    capabilities: list[str] = field(default_factory=list)
    lease_seconds: int | None = None


@dataclass(frozen=True)
class ChannelBlob:
    """A channel's new value at a new version (LangGraph's ``new_versions``): the value itself, or
    the fingerprint of a blob the project already holds (sent before, or uploaded in chunks)."""

    channel: str
    version: Any
    value: Blob | None = None
    fingerprint: str | None = None


@dataclass(frozen=True)
class Scalar:
    """A write's value kept in its row: a small JSON scalar (``MAX_INLINE_*``), ``None`` included."""

    value: Any


@dataclass(frozen=True)
class WriteSpec:
    """A pending write: its value inline as a blob, the fingerprint of a blob the project holds,
    or a small scalar kept in the write's own row (exactly one of the three)."""

    idx: int
    channel: str
    value: Blob | None = None
    fingerprint: str | None = None
    scalar: Scalar | None = None


@dataclass(frozen=True)
class LockedSession:
    """What a write to a thread reads of the session it locked."""

    id: int
    project_id: int
    status: str


@dataclass(frozen=True)
class Stored:
    """A put checkpoint with what it landed in."""

    graph: GraphCheckpoint
    thread: GraphThread
    runtime_id: int | None
    created: bool


def threads(caller: Caller) -> QuerySet[GraphThread]:
    return caller.scope("graph_thread", GraphThread.objects.filter(project_id__in=caller.project_ids))


def find_thread(caller: Caller, thread_id: str) -> GraphThread | None:
    return threads(caller).filter(thread_id=thread_id).select_related("session").first()


_GT = GraphThread._meta.db_table
_GC = GraphCheckpoint._meta.db_table
_RUN = Run._meta.db_table
#: The thread in the caller's reach (its projects; a bound token: its own session's thread).
_THREAD_IN_REACH = f"""
    SELECT o.{{col}} FROM {_GT} o
     WHERE o.thread_id = %(thread)s AND o.project_id = ANY(%(projects)s)
       AND (%(bound)s::bigint IS NULL OR o.session_id = %(bound)s::bigint)
     ORDER BY o.id LIMIT 1"""
#: A write to a thread, first statement: lock the thread's session (the session's ordering lock
#: first, ``events.order_lock_sql``: the subquery naming the session depends on parameters only,
#: so it is evaluated before the scan and its row lock) and read the thread's row along. What
#: may change while this waits for the lock (the open run, the checkpoints) is read by the
#: next statement, which sees what the previous holder committed. A recalled caller's token
#: (``apikit/auth.py``) is checked in the same statement (the last column).
_LOCK_THREAD_SQL = f"""
SELECT s.id, s.project_id, s.status, t.id, t.created_at, {TOKEN_STILL_VALID_SQL}
  FROM {_GT} t JOIN {Session._meta.db_table} s ON s.id = t.session_id
 WHERE t.id = ({_THREAD_IN_REACH.format(col="id")})
   AND {events.order_lock_sql(f"({_THREAD_IN_REACH.format(col='session_id')})")}
   FOR UPDATE OF s
"""


def lock_thread(caller: Caller, thread_id: str) -> tuple[GraphThread, LockedSession] | None:
    """Lock the session of the caller's thread ``thread_id`` (one statement; lock order: session,
    then run); None (nothing locked) when the caller reaches no such thread. A recalled
    caller's token is checked in that statement (401 if its row changed)."""
    assert transaction.get_connection().in_atomic_block
    events.before_order_lock()
    params = {"thread": thread_id, "projects": list(caller.project_ids), "bound": caller.session_id,
              **recheck_params(caller)}
    rows = commit.fetch_prepared(_LOCK_THREAD_SQL, params)
    if not rows:
        return None
    session_id, project_id, status, pk, created_at, still_valid = rows[0]
    token_confirmed(caller, still_valid)
    thread = GraphThread(id=pk, project_id=project_id, session_id=session_id, thread_id=thread_id, created_at=created_at)
    thread._state.adding = False
    thread._state.db = connection.alias
    return thread, LockedSession(session_id, project_id, status)


def _on_thread(caller: Caller, thread_id: str, open_spec: ThreadSpec | None,
               write: Callable[[GraphThread, LockedSession], Any]) -> tuple[Any, int | None]:
    """``write(thread, session)`` in one transaction, under the lock of the thread's session;
    and the runtime id when this call opened the thread. A thread the caller does not reach is
    opened with ``open_spec`` (else 404), in its own transaction committed first (a loser of the
    race to open it has then written nothing when it takes the winner's session ordering lock,
    ``events.order_lock``), and the write runs then. A thread that exists costs no lookup of
    its own: the lock statement finds it.

    A recalled caller (``apikit/auth.py``) that reaches no such thread is answered again with
    its token looked up: its token was checked in no statement, and opening a thread needs the
    caller's project."""
    opened: int | None = None
    tried = False
    while True:
        with transaction.atomic():
            locked = lock_thread(caller, thread_id)
            if locked is not None:
                return write(*locked), opened
        if caller.recheck is not None:
            raise Unauthorized("a recalled token reaches no such thread: answered with the token looked up")
        if open_spec is None or tried:
            raise NotFound("graph thread not found", thread_id=thread_id)
        tried = True
        _, opened = _open_thread(caller, thread_id, open_spec)


# ---- validation (before any transaction) ------------------------------------------------------------
def _name(value: Any, field_name: str, *, max_length: int = MAX_NAME_LENGTH, empty: bool = False) -> str:
    if not isinstance(value, str) or len(value) > max_length or (not value and not empty):
        raise ValidationFailed(f"{field_name} must be a string of {0 if empty else 1}–{max_length} characters",
                               field=field_name)
    return value


def _path(value: Any, field_name: str, *, empty: bool = False) -> str:
    """A thread id, a namespace or a task path (``MAX_PATH_LENGTH``), as the API schema declares it."""
    _name(value, field_name, max_length=MAX_PATH_LENGTH, empty=empty)
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_PATH_LENGTH:
        raise ValidationFailed(f"{field_name} is {size} bytes as UTF-8; at most {MAX_PATH_LENGTH}",
                               field=field_name, limit=MAX_PATH_LENGTH)
    return value


def _base64(data: Any, field_name: str, max_length: int) -> str:
    if not isinstance(data, str) or len(data) > max_length:
        raise ValidationFailed(f"{field_name} must be base64 text of at most {max_length} characters",
                               field=field_name, limit=max_length)
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationFailed(f"{field_name} must be base64", field=field_name) from None
    return data


def _fingerprint(value: Any, field_name: str) -> str:
    if not isinstance(value, str) or not _FINGERPRINT_RE.fullmatch(value):
        raise ValidationFailed(f"{field_name} must be sha256:<64 hex digits>", field=field_name)
    return value


def _blob(value: Blob, field_name: str) -> Blob:
    _name(value.serde, f"{field_name}.serde", max_length=64)
    _base64(value.data, f"{field_name}.data", MAX_BLOB_DATA_CHARS)
    return value


def _value_fingerprint(value: Blob | None, fingerprint: str | None, where: str, value_field: str) -> str:
    """The fingerprint of a blob sent inline (named ``value_field`` in refusals) or by reference."""
    if (value is None) == (fingerprint is None):
        raise ValidationFailed(f"{where} carries either its value or its fingerprint", field=where)
    if value is not None:
        return _blob(value, value_field).fingerprint()
    return _fingerprint(fingerprint, f"{where}.fingerprint")


def _version_key(value: Any, field_name: str) -> str:
    """The version's stored key (its JSON text), refused as the schema declares the version."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValidationFailed("a channel version is an integer, a number or a string", field=field_name)
    if isinstance(value, str):
        if len(value) > MAX_VERSION_LENGTH or not _VERSION_TEXT_RE.fullmatch(value):
            raise ValidationFailed(
                f'a channel version string is at most {MAX_VERSION_LENGTH} printable ASCII characters, without " or \\',
                field=field_name, limit=MAX_VERSION_LENGTH,
            )
    elif not MIN_VERSION_NUMBER <= value <= MAX_VERSION_NUMBER:  # a float's JSON text is at most 24 characters
        raise ValidationFailed(
            f"a channel version number is from {MIN_VERSION_NUMBER} to {MAX_VERSION_NUMBER}", field=field_name,
        )
    return json.dumps(value)


def _check_open(spec: ThreadSpec | None) -> None:
    """The ``open`` spec is checked on every call, as declared, whether it opens the thread or the
    thread exists already: a spec that could not open a thread is refused either way (422 naming
    ``open.<field>``), before anything is written."""
    if spec is None:
        return
    try:
        check(rt.validate_session_spec, role=spec.role, role_extension="", memory_policy=spec.memory_policy,
              task_mode=spec.task_mode, runtime_family=spec.runtime_family)
        check(rt.validate_capabilities, spec.capabilities)
        if spec.lease_seconds is not None and not 1 <= spec.lease_seconds <= MAX_LEASE_SECONDS:
            raise ValidationFailed(f"lease_seconds must be between 1 and {MAX_LEASE_SECONDS}", field="lease_seconds")
    except ServiceError as exc:
        details = dict(exc.details)
        details["field"] = f"open.{details['field']}" if details.get("field") else "open"
        raise type(exc)(exc.message, **details) from None


def _check_scalar(channel: str, value: Any, where: str) -> None:
    """A value kept inline (a put's ``values``, a write's ``scalar``) is a small JSON scalar
    (``MAX_INLINE_*``) of a channel not named like a conversation (422 naming ``where``)."""
    if channel.lower() in rt.TRANSCRIPT_KEYS:
        raise ValidationFailed("a channel named like a conversation (messages, history, …) is a blob, never inline",
                               field=where)
    if type(value) is int:
        if abs(value) > MAX_INLINE_INT:
            raise ValidationFailed("an integer inline is at most 2**53 in magnitude: send it as a blob",
                                   field=where, limit=MAX_INLINE_INT)
    elif type(value) is str:
        if len(value) > MAX_INLINE_CHARS:
            raise ValidationFailed(f"a string inline is at most {MAX_INLINE_CHARS} characters: send it as a blob",
                                   field=where, limit=MAX_INLINE_CHARS)
        check(rt.check_storable_text, value, where)
    elif value is not None and type(value) is not bool:
        raise ValidationFailed("a value inline is null, a boolean, an integer or a string: send others as blobs",
                               field=where)


def _inline_values(values: Mapping[str, Any] | None, versions: Mapping[str, Any]) -> dict[str, Any]:
    """The channel values a put carries inline (``MAX_INLINE_*``), checked: each names a channel
    the checkpoint has a version for and is a small JSON scalar (422 naming ``values.<channel>``)."""
    if not values:
        return {}
    if not isinstance(values, Mapping):
        raise ValidationFailed("values must be a JSON object", field="values")
    for channel, value in values.items():
        where = f"values.{channel}"
        if channel not in versions:  # the checkpoint's own channel names are checked (_document)
            raise ValidationFailed("a value inline names a channel the checkpoint has a version for", field=where)
        _check_scalar(channel, value, where)
    inline = dict(sorted(values.items()))
    check(rt.validate_metadata, inline, "values", MAX_INLINE_VALUES_BYTES)
    return inline


def _document(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(checkpoint, Mapping):
        raise ValidationFailed("checkpoint must be a JSON object", field="checkpoint")
    if "channel_values" in checkpoint:
        raise ValidationFailed("channel values travel as blobs, never inside the checkpoint", field="checkpoint.channel_values")
    versions = checkpoint.get("channel_versions", {})
    if not isinstance(versions, Mapping):
        raise ValidationFailed("checkpoint.channel_versions must be an object", field="checkpoint.channel_versions")
    for channel, version in versions.items():
        _name(channel, f"checkpoint.channel_versions.{channel}")
        _version_key(version, f"checkpoint.channel_versions.{channel}")
    return check(rt.validate_metadata, dict(checkpoint), "checkpoint", settings.CHECKPOINT_MAX_BYTES)


# ---- blobs ---------------------------------------------------------------------------------------------
# Set-based: a request's blobs are written and resolved by a fixed number of statements, however
# many it carries (one row per blob through ``unnest`` of parallel arrays).
_A = Artifact._meta.db_table
_AV = ArtifactVersion._meta.db_table
_GB = GraphBlob._meta.db_table
_GW = GraphWrite._meta.db_table
_CHUNK = GraphBlobChunk._meta.db_table

#: New blobs, one statement. Each artifact is inserted already naming its version's id (drawn
#: from the versions' sequence): both foreign keys between the two tables are checked at commit
#: (Django declares them DEFERRABLE INITIALLY DEFERRED), so no UPDATE of the new artifacts is
#: needed. A content another writer stored first (committed, or committing: ON CONFLICT waits
#: for it) is skipped; the resolving statements read it afterwards.
_INSERT_BLOBS_SQL = f"""
WITH input AS MATERIALIZED (
    SELECT i.fp, i.content, nextval(pg_get_serial_sequence('{_AV}', 'id')) AS version_id
    FROM unnest(%s::text[], %s::text[]) AS i(fp, content)
), created AS (
    INSERT INTO {_A} (project_id, name, kind, current_version_id, created_at)
    SELECT %s, '{BLOB_PREFIX}' || fp, '{BLOB_KIND}', version_id, now() FROM input
    ON CONFLICT (project_id, name) DO NOTHING
    RETURNING id, name, current_version_id
)
INSERT INTO {_AV} (id, artifact_id, number, content, fingerprint, created_by, created_at)
SELECT c.current_version_id, c.id, 1, i.content, i.fp, %s, now()
FROM created c JOIN input i ON c.name = '{BLOB_PREFIX}' || i.fp
"""


def _insert_blobs(project_id: int, blobs: Mapping[str, str], actor: str) -> None:
    """Store the contents (fingerprint → content) the project does not hold yet: one statement."""
    if not blobs:
        return
    fps = sorted(blobs)
    commit.fetch_prepared(_INSERT_BLOBS_SQL, [fps, [blobs[fp] for fp in fps], project_id, actor])


def missing_blobs(caller: Caller, fingerprints: list[str]) -> list[str]:
    """Which of these fingerprints name no blob of the caller's project (one query): what a
    client must upload before it may name them in a put or a write."""
    caller.require("write")
    if len(fingerprints) > MAX_ASKED_FINGERPRINTS:
        raise ValidationFailed(f"at most {MAX_ASKED_FINGERPRINTS} fingerprints", field="fingerprints",
                               limit=MAX_ASKED_FINGERPRINTS)
    for i, fp in enumerate(fingerprints):
        _fingerprint(fp, f"fingerprints[{i}]")
    project = caller.single_project()
    held = set(Artifact.objects.filter(
        project_id=project.id, name__in=[BLOB_PREFIX + fp for fp in fingerprints]).values_list("name", flat=True))
    return sorted({fp for fp in fingerprints if BLOB_PREFIX + fp not in held})


@dataclass(frozen=True)
class ChunkStored:
    fingerprint: str
    complete: bool
    received: int


def upload_chunk(caller: Caller, *, fingerprint: str, serde: str, index: int, count: int, data: str) -> ChunkStored:
    """Stage one chunk of a blob; with its last chunk, write the blob (an artifact named by its
    fingerprint) from the staged chunks and drop them.

    Refusals, writing nothing: invalid fields (422) → the chunks do not make the content the
    fingerprint names, or disagree on serializer or count (422 ``graph_blob_mismatch``: every
    staged chunk of that fingerprint is dropped too, so a fresh upload starts clean). A chunk of
    a blob the project already holds is accepted and ignored (``complete``): uploads are safe to
    repeat. A chunk sent again replaces the staged one.
    """
    caller.require("write")
    _fingerprint(fingerprint, "fingerprint")
    _name(serde, "serde", max_length=64)
    if not isinstance(count, int) or not 1 <= count <= MAX_CHUNKS:
        raise ValidationFailed(f"count must be from 1 to {MAX_CHUNKS}", field="count", limit=MAX_CHUNKS)
    if not isinstance(index, int) or not 0 <= index < count:
        raise ValidationFailed("index must be from 0 to count - 1", field="index")
    _base64(data, "data", MAX_CHUNK_CHARS)
    if len(data) % 4:
        raise ValidationFailed("a chunk is whole base64 quanta (a multiple of 4 characters)", field="data")
    project = caller.single_project()
    refusal: ServiceError | None = None
    with transaction.atomic(), connection.cursor() as cursor:
        # The chunks of one fingerprint are staged one writer at a time: the writer of the last
        # chunk then sees every other chunk, and only one writer assembles the blob.
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"graph-blob:{project.id}:{fingerprint}"])
        cursor.execute(f"SELECT 1 FROM {_A} WHERE project_id = %s AND name = %s", [project.id, BLOB_PREFIX + fingerprint])
        if cursor.fetchone() is not None:
            return ChunkStored(fingerprint, True, count)
        if index == 0:
            cursor.execute(f"DELETE FROM {_CHUNK} WHERE project_id = %s AND created_at < now() - make_interval(secs => %s)",
                           [project.id, STALE_CHUNK_SECONDS])
        cursor.execute(
            f"""INSERT INTO {_CHUNK} (project_id, fingerprint, serde, index, count, data, created_at)
            VALUES (%s, %s, %s, %s, %s, %s, now())
            ON CONFLICT (project_id, fingerprint, index) DO UPDATE
            SET serde = EXCLUDED.serde, count = EXCLUDED.count, data = EXCLUDED.data, created_at = EXCLUDED.created_at
            RETURNING (SELECT count(*) FROM {_CHUNK} WHERE project_id = %s AND fingerprint = %s AND index <> %s) + 1""",
            [project.id, fingerprint, serde, index, count, data, project.id, fingerprint, index],
        )
        received = cursor.fetchone()[0]
        if received < count:
            return ChunkStored(fingerprint, False, received)
        # Every chunk is here (or more than ``count`` of them, from an upload that said otherwise):
        # the staged chunks go either way, into the blob or refused.
        cursor.execute(f"DELETE FROM {_CHUNK} WHERE project_id = %s AND fingerprint = %s RETURNING index, serde, count, data",
                       [project.id, fingerprint])
        chunks = sorted(cursor.fetchall())
        whole = "".join(c[3] for c in chunks)
        agree = [c[0] for c in chunks] == list(range(count)) and all((c[1], c[2]) == (serde, count) for c in chunks)
        content = blob_content(serde, whole)
        if len(whole) > MAX_BLOB_DATA_CHARS:
            refusal = ValidationFailed(f"a blob is at most {MAX_BLOB_BYTES} bytes ({MAX_BLOB_DATA_CHARS} base64 "
                                       "characters)", field="data", limit=MAX_BLOB_DATA_CHARS)
        elif not agree or content_fingerprint(content.encode()) != fingerprint or not _is_base64(whole):
            refusal = GraphBlobMismatch("the uploaded chunks do not make the content this fingerprint names",
                                        fingerprint=fingerprint, chunks=len(chunks), count=count)
        else:
            _insert_blobs(project.id, {fingerprint: content}, caller.label)
    if refusal is not None:
        # Raised after the commit: the refused upload's staged chunks stay dropped (a fresh upload
        # starts clean) and no blob was written.
        raise refusal
    return ChunkStored(fingerprint, True, count)


def _is_base64(data: str) -> bool:
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def blob_contents(project_ids: Iterable[int], fingerprints: Iterable[str]) -> dict[str, dict[str, str]]:
    """Fingerprint → ``{"serde", "data"}`` of stored blobs (one query)."""
    wanted = {BLOB_PREFIX + fp for fp in fingerprints}
    if not wanted:
        return {}
    rows = ArtifactVersion.objects.filter(
        artifact__project_id__in=list(project_ids), artifact__name__in=wanted, number=1,
    ).values_list("fingerprint", "content")
    return {fp: json.loads(content) for fp, content in rows}


# ---- threads -------------------------------------------------------------------------------------------
def _open_thread(caller: Caller, thread_id: str, spec: ThreadSpec) -> tuple[GraphThread, int | None]:
    """The thread's session, opened with runtime generation 1 and run 1 if the thread is new."""
    existing = find_thread(caller, thread_id)
    if existing is not None:
        return existing, None
    try:
        # Two first puts of one thread race on the thread's unique constraint; the loser's
        # session, runtime and run roll back with this savepoint and it takes the winner's.
        with transaction.atomic():
            session = session_actions.create_session(
                caller,
                session_actions.NewSession(
                    role=spec.role, memory_policy=spec.memory_policy, task_mode=spec.task_mode,
                    runtime_family=spec.runtime_family, provider_metadata={"graph_thread_id": thread_id},
                ),
                runtime=RuntimeSpec(runtime_family=spec.runtime_family, capabilities=list(spec.capabilities),
                                    lease_seconds=spec.lease_seconds),
            )
            thread = GraphThread.objects.create(project_id=session.project_id, session=session, thread_id=thread_id)
            run_actions.start_run(caller, session.id, cursor={"graph": {"thread_id": thread_id}},
                                  runtime_id=session.created_runtime_id)
    except IntegrityError:
        winner = find_thread(caller, thread_id)
        if winner is None:
            # The id is taken by a thread this caller may not see: answer as for a missing thread
            # (ids are not an oracle), never a 500. Unreachable while only unbound tokens open
            # threads (create_session refuses a bound one); kept as the uniform answer.
            if GraphThread.objects.filter(project_id__in=caller.project_ids, thread_id=thread_id).exists():
                raise NotFound("graph thread not found", thread_id=thread_id) from None
            raise
        return winner, None
    return thread, session.created_runtime_id


def open_thread(caller: Caller, thread_id: str, spec: ThreadSpec) -> tuple[GraphThread, int | None]:
    """Open (or find) a thread's session without writing a checkpoint. Returns the runtime id
    when this call opened it."""
    caller.require("write")
    _path(thread_id, "thread_id")
    _check_open(spec)
    with transaction.atomic():
        return _open_thread(caller, thread_id, spec)


# ---- checkpoints ------------------------------------------------------------------------------------------
#: Every blob lookup below is a scalar subquery per row of the request (one index probe each, on
#: every column of a unique index): as a join, the planner's estimates for young tables chose to
#: scan all of the thread's (or the project's) blobs, a cost that grew with every superstep.
#: (``OFFSET 0`` keeps the channel lookups a subquery of their own, evaluated once per row.)
#: The put's (channel, version) → blob rows, and what the checkpoint cites, in one statement:
#: the upsert of the put's rows (the latest value at a (channel, version) stands, as in
#: LangGraph's own savers); the stored rows of the channels the put did not bring (read from the
#: statement's snapshot, which the upsert does not touch: they are other pairs); the artifact of
#: every fingerprint the put names, with its head version (inline ones were inserted by the
#: statement before); the checkpoint this id already names, if any (a retry), and the session's
#: open run. Run after the session lock, it sees what the lock's previous holder committed.
#: Each blob's artifact is locked ``FOR KEY SHARE`` (garbage collection cannot take it until this
#: transaction, and the checkpoint citing it, commits); one collected meanwhile is not returned.
_RESOLVE_PUT_SQL = f"""
WITH upsert AS (
    INSERT INTO {_GB} (thread_id, checkpoint_ns, channel, version, fingerprint)
    SELECT %(thread)s, %(ns)s, u.channel, u.version, u.fp
    FROM unnest(%(put_channels)s::text[], %(put_versions)s::text[], %(put_fps)s::text[]) AS u(channel, version, fp)
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET fingerprint = EXCLUDED.fingerprint
    RETURNING 1
)
SELECT 'stored', o.channel, o.fingerprint, o.artifact[1], o.artifact[2] FROM (
    SELECT s.channel, s.fingerprint,
           (SELECT ARRAY[a.id, a.current_version_id] FROM {_A} a
             WHERE a.project_id = %(project)s AND a.name = '{BLOB_PREFIX}' || s.fingerprint FOR KEY SHARE) AS artifact
    FROM (
        SELECT o.channel, (SELECT g.fingerprint FROM {_GB} g
                            WHERE g.thread_id = %(thread)s AND g.checkpoint_ns = %(ns)s AND g.channel = o.channel
                              AND g.version = o.version) AS fingerprint
        FROM unnest(%(old_channels)s::text[], %(old_versions)s::text[]) AS o(channel, version)
        OFFSET 0
    ) s WHERE s.fingerprint IS NOT NULL
) o WHERE o.artifact IS NOT NULL
UNION ALL
SELECT 'named', NULL, substr(n.name, {len(BLOB_PREFIX) + 1}), n.artifact[1], n.artifact[2] FROM (
    SELECT n.name, (SELECT ARRAY[a.id, a.current_version_id] FROM {_A} a
                     WHERE a.project_id = %(project)s AND a.name = n.name FOR KEY SHARE) AS artifact
    FROM unnest(%(names)s::text[]) AS n(name)
) n WHERE n.artifact IS NOT NULL
UNION ALL
SELECT 'existing', NULL, NULL, c.id, NULL FROM {_GC} c
 WHERE c.thread_id = %(thread)s AND c.checkpoint_ns = %(ns)s AND c.checkpoint_id = %(cp)s
UNION ALL
SELECT 'run', NULL, NULL, r.id, NULL FROM {_RUN} r WHERE r.session_id = %(session)s AND r.state = %(open)s
"""


#: The graph row of a new checkpoint, inserted by the checkpoint's own statement (``Beside``: ``c``
#: is the bounded checkpoint inserted; one round trip for both, and no graph row when it is refused).
_GRAPH_ROW_BESIDE = f"""INSERT INTO {_GC}
    (thread_id, record_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, metadata, document, created_at)
  SELECT %(g_thread)s, c.id, %(g_ns)s, %(g_cp)s, %(g_parent)s, %(g_metadata)s::jsonb, %(g_document)s::jsonb,
         %(created_at)s
    FROM c
  RETURNING id"""


def put_checkpoint(
    caller: Caller, *, thread_id: str, checkpoint_ns: str, checkpoint_id: str, parent_checkpoint_id: str | None,
    checkpoint: Mapping[str, Any], metadata: Mapping[str, Any] | None, blobs: list[ChannelBlob],
    open_spec: ThreadSpec | None, writes: list[TaskWrites] | None = None, values: Mapping[str, Any] | None = None,
) -> Stored:
    """Record one graph checkpoint as a bounded checkpoint of the thread's open run.

    A fixed set of statements whatever the number of blobs: lock the thread's session (with its
    open run and the checkpoint this id already names: ``lock_thread``), insert the new inline
    blobs, resolve (and upsert) the channel blobs with their artifacts' heads, the checkpoint
    (``record_checkpoint``, given the refs resolved here) with the graph row in its statement.

    Refusals, writing nothing: invalid ids, blobs or bookkeeping (422) → the thread is unknown
    and ``open_spec`` is None (404) → the session has no open run (409 ``no_open_run``: resume
    it) → a blob named by fingerprint is not in the project (409 ``graph_blob_missing``) → the
    id already names a different checkpoint (409 ``graph_checkpoint_conflict``).
    A retried identical put returns the stored checkpoint.

    ``writes``: tasks' pending writes carried by this put (the saver holds a task's writes until
    the put that follows them): stored first, in the put's transaction, as ``put_writes`` stores
    them; refused or rolled back with it.

    ``values``: channels whose values are small JSON scalars (``MAX_INLINE_*``), kept in the
    checkpoint's document (``channel_values``) instead of as blobs; a channel is inline or a blob
    in one put, not both (422). A channel a put neither carries nor names inline is found at the
    version ``channel_versions`` names, as before.
    """
    caller.require("write")
    _path(thread_id, "thread_id")
    _path(checkpoint_ns, "checkpoint_ns", empty=True)
    _name(checkpoint_id, "checkpoint_id", max_length=MAX_ID_LENGTH)
    parent = _name(parent_checkpoint_id or "", "parent_checkpoint_id", max_length=MAX_ID_LENGTH, empty=True)
    put: dict[tuple[str, str], str] = {}  # (channel, version key) → fingerprint; the last one sent stands
    inline: dict[str, str] = {}  # fingerprint → content
    for i, b in enumerate(blobs):
        _name(b.channel, f"blobs[{i}].channel")
        key = _version_key(b.version, f"blobs[{i}].version")
        fp = _value_fingerprint(b.value, b.fingerprint, f"blobs[{i}]", f"blobs[{i}]")
        if b.value is not None:
            inline[fp] = b.value.content()
        put[(b.channel, key)] = fp
    document = _document(checkpoint)
    scalars = _inline_values(values, document.get("channel_versions") or {})
    both = sorted({ch for ch, _ in put} & set(scalars))
    if both:
        raise ValidationFailed("a channel is put inline or as a blob, not both", field=f"values.{both[0]}")
    meta = check(rt.validate_metadata, dict(metadata or {}), "metadata", MAX_METADATA_BYTES)
    if writes and len(writes) > MAX_PUT_TASK_WRITES:
        raise ValidationFailed(f"a put carries the writes of at most {MAX_PUT_TASK_WRITES} tasks", field="writes",
                               limit=MAX_PUT_TASK_WRITES)
    carried = [_writes_params(caller, thread_id=thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id=w.checkpoint_id,
                              task_id=w.task_id, task_path=w.task_path, writes=w.writes, where=f"writes[{i}].")
               for i, w in enumerate(writes or [])]
    _check_open(open_spec)

    def write(thread: GraphThread, session: LockedSession) -> tuple[GraphCheckpoint, bool]:
        # The session lock serialises the thread's writers (lock order: session, then run).
        for params in carried:  # first: their values may be the very ones this put names
            if _store_writes(caller, params) is None:  # unreachable under the lock this put holds
                raise NotFound("graph thread not found", thread_id=thread_id)
        _insert_blobs(session.project_id, inline, caller.label)
        versions = {ch: json.dumps(v) for ch, v in sorted((document.get("channel_versions") or {}).items())}
        old = [(ch, v) for ch, v in versions.items() if (ch, v) not in put and ch not in scalars]
        named = sorted(set(put.values()))
        params = {
            "thread": thread.id, "ns": checkpoint_ns, "project": session.project_id,
            "put_channels": [ch for ch, _ in put], "put_versions": [v for _, v in put],
            "put_fps": list(put.values()),
            "old_channels": [ch for ch, _ in old], "old_versions": [v for _, v in old],
            "names": [BLOB_PREFIX + fp for fp in named], "cp": checkpoint_id, "session": session.id,
            "open": rt.RunState.OPEN.value,
        }
        rows = commit.fetch_prepared(_RESOLVE_PUT_SQL, params)
        artifact_of = {fp: artifact_id for kind, _, fp, artifact_id, _ in rows if kind in ("stored", "named")}
        collected = {fp: content for fp, content in inline.items() if fp not in artifact_of}
        if collected:
            # A value sent inline that the project held when the insert skipped it, collected by
            # garbage collection before the resolve could lock it: stored again (now locked by
            # this transaction's own insert) and resolved once more.
            _insert_blobs(session.project_id, collected, caller.label)
            rows = commit.fetch_prepared(_RESOLVE_PUT_SQL, params)
            artifact_of = {fp: artifact_id for kind, _, fp, artifact_id, _ in rows if kind in ("stored", "named")}
        heads = {(artifact_id, fp): head for kind, _, fp, artifact_id, head in rows if kind in ("stored", "named")}
        existing_id = next((i for kind, _, _, i, _ in rows if kind == "existing"), None)
        open_run_id = next((i for kind, _, _, i, _ in rows if kind == "run"), None)
        missing = [fp for fp in named if fp not in artifact_of]
        if missing:
            raise GraphBlobMissing("a blob named by fingerprint is not in this project: upload it first",
                                   missing=missing)
        stored = {ch: fp for kind, ch, fp, _, _ in rows if kind == "stored"}
        fps: dict[str, str] = {}
        for ch, v in versions.items():
            if (ch, v) in put:
                fps[ch] = put[(ch, v)]
            elif ch in stored:
                fps[ch] = stored[ch]
        document["blobs"] = fps
        if scalars:
            document["channel_values"] = scalars
        if existing_id is not None:
            existing = GraphCheckpoint.objects.get(id=existing_id)
            if (existing.parent_checkpoint_id, existing.document, existing.metadata) != (parent, document, meta):
                raise GraphCheckpointConflict("this graph checkpoint id already names a different checkpoint",
                                              thread_id=thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id)
            existing.thread = thread
            return existing, False
        if open_run_id is None:
            raise NoOpenRun("the thread's session has no open run: resume the session first",
                            status=session.status, session_id=session.id)
        refs = sorted({(artifact_of[fp], fp) for fp in fps.values()})
        cursor_doc: dict[str, Any] = {"graph": {"checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}}
        if isinstance(meta.get("step"), int):
            cursor_doc["graph"]["step"] = meta["step"]
        # The refs are this thread's own state blobs (their content came in this thread's puts,
        # which the caller reaches), not a citation of what another session holds: a blob stored
        # once per project may have been written first by another thread's token.
        record = record_checkpoint(caller, open_run_id, {
            "boundary": rt.CheckpointBoundary.CONTEXT_FREEZE.value, "cursor": cursor_doc,
            "artifacts": [{"artifact_id": a, "fingerprint": fp} for a, fp in refs],
        }, resolved=ResolvedRefs(session.id, session.project_id, heads), beside=Beside(_GRAPH_ROW_BESIDE, {
            "g_thread": thread.id, "g_ns": checkpoint_ns, "g_cp": checkpoint_id, "g_parent": parent,
            "g_metadata": json.dumps(meta), "g_document": json.dumps(document),
        }))
        graph = GraphCheckpoint(
            id=record.beside_id, thread=thread, record=record, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id,
            parent_checkpoint_id=parent, metadata=meta, document=document, created_at=record.created_at,
        )
        graph._state.adding = False
        graph._state.db = connection.alias
        return graph, True

    (graph, created), opened_runtime = _on_thread(caller, thread_id, open_spec, write)
    return Stored(graph, graph.thread, opened_runtime, created)


#: A task's writes, one statement, its own transaction (``commit.execute_write``): the thread in
#: the caller's reach, its session locked FOR SHARE (a thread's writes do not wait for each
#: other, and a delete of the thread, which locks the session FOR UPDATE, waits for them or is
#: waited for: then no thread is found); a recalled caller's token checked (``ok``); the held
#: blobs' artifacts locked FOR KEY SHARE (garbage collection waits for the commit; one it
#: collected meanwhile is not held: stored again when inline, else ``missing``); the new
#: inline blobs inserted (skipped when a value names a blob the project does not hold:
#: ``missing``); the values resolved to the blobs' versions (a scalar write keeps its JSON text in
#: its own row: no blob to look up, lock or insert); writes with a non-negative index
#: stored once (a repeated (task, idx) is the same write delivered again), LangGraph's special
#: channels (negative index: error, interrupt, resume…) keep the latest value. A content another
#: writer committed while this statement ran is skipped by the insert and not in its snapshot
#: (``unresolved``): then no write is stored and the statement is sent again. Sent ``compact``, so
#: that psycopg keeps its parsing (``commit.PARSE_CACHED_BYTES``).
_PUT_WRITES_SQL = commit.compact(f"""
WITH reach AS MATERIALIZED (
    SELECT t.id, t.project_id FROM {_GT} t JOIN {Session._meta.db_table} s ON s.id = t.session_id
     WHERE t.thread_id = %(thread_id)s AND t.project_id = ANY(%(projects)s)
       AND (%(bound)s::bigint IS NULL OR t.session_id = %(bound)s::bigint)
     ORDER BY t.id LIMIT 1
       FOR SHARE OF s
), ok AS MATERIALIZED (
    SELECT r.id, r.project_id FROM reach r WHERE {TOKEN_STILL_VALID_SQL}
), held AS MATERIALIZED (
    SELECT n.fp, (
        SELECT v.id FROM {_A} a JOIN {_AV} v ON v.artifact_id = a.id AND v.number = 1
         WHERE a.project_id = (SELECT o.project_id FROM ok o) AND a.name = '{BLOB_PREFIX}' || n.fp
           FOR KEY SHARE OF a
    ) AS value_id
    FROM (SELECT DISTINCT u.fp FROM unnest(%(fps)s::text[]) AS u(fp) WHERE u.fp IS NOT NULL) n
), missing AS MATERIALIZED (
    SELECT array_agg(h.fp ORDER BY h.fp) AS fps FROM held h
     WHERE h.value_id IS NULL AND h.fp <> ALL(%(blob_fps)s::text[])
), input AS MATERIALIZED (
    SELECT i.fp, i.content, nextval(pg_get_serial_sequence('{_AV}', 'id')) AS version_id
    FROM unnest(%(blob_fps)s::text[], %(blob_contents)s::text[]) AS i(fp, content)
    WHERE EXISTS (SELECT 1 FROM ok) AND (SELECT m.fps FROM missing m) IS NULL
      AND NOT EXISTS (SELECT 1 FROM held h WHERE h.fp = i.fp AND h.value_id IS NOT NULL)
), created AS (
    INSERT INTO {_A} (project_id, name, kind, current_version_id, created_at)
    SELECT (SELECT o.project_id FROM ok o), '{BLOB_PREFIX}' || fp, '{BLOB_KIND}', version_id, now() FROM input
    ON CONFLICT (project_id, name) DO NOTHING
    RETURNING id, name, current_version_id
), versions AS (
    INSERT INTO {_AV} (id, artifact_id, number, content, fingerprint, created_by, created_at)
    SELECT c.current_version_id, c.id, 1, i.content, i.fp, %(actor)s, now()
    FROM created c JOIN input i ON c.name = '{BLOB_PREFIX}' || i.fp
    RETURNING id, fingerprint
), vals AS MATERIALIZED (
    SELECT w.idx, w.channel, w.fp, w.scalar,
           CASE WHEN w.fp IS NOT NULL
                THEN COALESCE(h.value_id, (SELECT v.id FROM versions v WHERE v.fingerprint = w.fp)) END AS value_id
    FROM unnest(%(idx)s::int[], %(channels)s::text[], %(fps)s::text[], %(scalars)s::text[])
         AS w(idx, channel, fp, scalar)
    LEFT JOIN held h ON h.fp = w.fp
), unresolved AS MATERIALIZED (
    SELECT array_agg(DISTINCT fp ORDER BY fp) AS fps FROM vals WHERE fp IS NOT NULL AND value_id IS NULL
), kept AS (
    INSERT INTO {_GW} (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, value_id, scalar,
                       created_at)
    SELECT (SELECT o.id FROM ok o), %(ns)s, %(cp)s, %(task)s, %(path)s, idx, channel, value_id, scalar, now() FROM vals
    WHERE idx >= 0 AND EXISTS (SELECT 1 FROM ok) AND (SELECT u.fps FROM unresolved u) IS NULL
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
    RETURNING 1
), latest AS (
    INSERT INTO {_GW} (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, value_id, scalar,
                       created_at)
    SELECT (SELECT o.id FROM ok o), %(ns)s, %(cp)s, %(task)s, %(path)s, idx, channel, value_id, scalar, now() FROM vals
    WHERE idx < 0 AND EXISTS (SELECT 1 FROM ok) AND (SELECT u.fps FROM unresolved u) IS NULL
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE
    SET channel = EXCLUDED.channel, value_id = EXCLUDED.value_id, scalar = EXCLUDED.scalar,
        task_path = EXCLUDED.task_path
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM reach), EXISTS (SELECT 1 FROM ok), (SELECT m.fps FROM missing m),
       (SELECT u.fps FROM unresolved u), (SELECT count(*) FROM kept) + (SELECT count(*) FROM latest)
""")


@dataclass(frozen=True)
class TaskWrites:
    """A task's pending writes carried by the put that follows them (``put_checkpoint(writes=…)``):
    stored in the put's transaction, as ``put_writes`` would store them, before its checkpoint."""

    checkpoint_id: str
    task_id: str
    writes: list[WriteSpec]
    task_path: str = ""


#: How many tasks' writes one put may carry.
MAX_PUT_TASK_WRITES = 64


def _writes_params(caller: Caller, *, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str,
                   task_path: str, writes: list[WriteSpec], where: str = "") -> dict[str, Any]:
    """A task's writes checked (422 naming ``where`` + the field) and made the statement's parameters."""
    _name(checkpoint_id, f"{where}checkpoint_id", max_length=MAX_ID_LENGTH)
    _name(task_id, f"{where}task_id", max_length=MAX_ID_LENGTH)
    _path(task_path, f"{where}task_path", empty=True)
    rows: dict[int, tuple[str, str | None, str | None]] = {}  # idx → (channel, fingerprint, scalar's JSON)
    inline: dict[str, str] = {}
    for i, w in enumerate(writes):
        _name(w.channel, f"{where}writes[{i}].channel")
        fp: str | None = None
        scalar: str | None = None
        if w.scalar is not None:
            if w.value is not None or w.fingerprint is not None:
                raise ValidationFailed(f"{where}writes[{i}] carries one of its value, its fingerprint or its scalar",
                                       field=f"{where}writes[{i}]")
            _check_scalar(w.channel, w.scalar.value, f"{where}writes[{i}].scalar")
            scalar = canonical_json(w.scalar.value).decode()
        else:
            fp = _value_fingerprint(w.value, w.fingerprint, f"{where}writes[{i}]", f"{where}writes[{i}].value")
            if w.value is not None:
                inline[fp] = w.value.content()
        if w.idx < 0 or w.idx not in rows:
            # a repeated (task, idx) in one call: the first stands, as stored ones do; a special
            # channel's latest value stands
            rows[w.idx] = (w.channel, fp, scalar)
    blob_fps = sorted(inline)  # inserted in this order by every writer: two never wait on each other in a cycle
    return {
        "thread_id": thread_id, "projects": list(caller.project_ids), "bound": caller.session_id,
        **recheck_params(caller),
        "idx": list(rows), "channels": [ch for ch, _, _ in rows.values()], "fps": [fp for _, fp, _ in rows.values()],
        "scalars": [scalar for _, _, scalar in rows.values()],
        "blob_fps": blob_fps, "blob_contents": [inline[fp] for fp in blob_fps], "actor": caller.label,
        "ns": checkpoint_ns, "cp": checkpoint_id, "task": task_id, "path": task_path,
    }


def _store_writes(caller: Caller, params: dict[str, Any]) -> int | None:
    """Run the writes' statement (``_PUT_WRITES_SQL``): how many rows are new or updated, or None
    when the caller reaches no such thread (nothing written). Its own transaction when called
    outside one; else one more statement of the caller's (a put carrying writes)."""
    raced = False
    while True:
        reached, still_valid, missing, unresolved, changed = commit.execute_write(_PUT_WRITES_SQL, params)
        if not reached:
            return None
        token_confirmed(caller, still_valid)
        if missing:
            raise GraphBlobMissing("a blob named by fingerprint is not in this project: upload it first",
                                   missing=list(missing))
        if unresolved and not raced:
            raced = True  # a content committed by another writer while the statement ran: now in the snapshot
            continue
        if unresolved:  # a blob stored by another writer, then collected before this could lock it: sent again
            raise GraphBlobMissing("a blob named by fingerprint is not in this project: upload it first",
                                   missing=list(unresolved))
        return changed


def put_writes(
    caller: Caller, *, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str, task_path: str,
    writes: list[WriteSpec], open_spec: ThreadSpec | None = None,
) -> int:
    """Store a task's pending writes against a graph checkpoint id; returns how many rows are new
    or updated. The checkpoint need not have landed yet (graphs store checkpoints in the
    background); an unknown thread is opened with ``open_spec``, else 404. A value named by
    fingerprint must be a blob of the project (else 409 ``graph_blob_missing``, nothing written).

    One statement whatever the number of writes (``_PUT_WRITES_SQL``), its own transaction: one
    round trip. A thread this caller does not reach yet is opened first (its own transaction),
    then the statement runs again."""
    caller.require("write")
    _path(thread_id, "thread_id")
    _path(checkpoint_ns, "checkpoint_ns", empty=True)
    params = _writes_params(caller, thread_id=thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id,
                            task_id=task_id, task_path=task_path, writes=writes)
    _check_open(open_spec)
    opened = False
    while True:
        changed = _store_writes(caller, params)
        if changed is not None:
            return changed
        if caller.recheck is not None:  # as _on_thread: answered again with the token looked up
            raise Unauthorized("a recalled token reaches no such thread: answered with the token looked up")
        if open_spec is None or opened:
            raise NotFound("graph thread not found", thread_id=thread_id)
        opened = True
        _open_thread(caller, thread_id, open_spec)


def writes_of(items: list[GraphCheckpoint]) -> dict[tuple[int, str, str], list[GraphWrite]]:
    """(thread pk, namespace, checkpoint id) → its pending writes, for a page of checkpoints (one query)."""
    if not items:
        return {}
    wanted = Q()
    for g in items:
        wanted |= Q(thread_id=g.thread_id, checkpoint_ns=g.checkpoint_ns, checkpoint_id=g.checkpoint_id)
    found: dict[tuple[int, str, str], list[GraphWrite]] = {}
    for w in GraphWrite.objects.filter(wanted).select_related("value").order_by("task_id", "idx"):
        found.setdefault((w.thread_id, w.checkpoint_ns, w.checkpoint_id), []).append(w)
    return found


def list_checkpoints(
    caller: Caller, *, thread_id: str | None, checkpoint_ns: str | None = None, checkpoint_id: str | None = None,
    before: str | None = None, metadata: Mapping[str, Any] | None = None, limit: int = 50,
) -> list[GraphCheckpoint]:
    """Newest first (graph checkpoint ids are time-ordered); their writes: :func:`writes_of`."""
    caller.require("read")
    qs = GraphCheckpoint.objects.filter(thread__in=threads(caller))
    if thread_id is not None:
        qs = qs.filter(thread__thread_id=thread_id)
    if checkpoint_ns is not None:
        qs = qs.filter(checkpoint_ns=checkpoint_ns)
    if checkpoint_id is not None:
        qs = qs.filter(checkpoint_id=checkpoint_id)
    if before is not None:
        qs = qs.filter(checkpoint_id__lt=before)
    if metadata:
        qs = qs.filter(metadata__contains=dict(metadata))
    return list(qs.select_related("thread", "record").order_by("-checkpoint_id", "-id")[:limit])


def delete_thread(caller: Caller, thread_id: str) -> int | None:
    """Close the thread session's live runtime and forget the session. Returns the forgotten
    session's id, or None when no such thread exists (deleting nothing is not an error). The
    thread's blobs that nothing else cites are removed by the next garbage collection
    (``control/graph_gc.py``)."""
    caller.require("write")
    _path(thread_id, "thread_id")
    with transaction.atomic():
        thread = find_thread(caller, thread_id)
        if thread is None:
            return None
        session = lock_session(caller, thread.session_id)
        attachment = live_runtime(session)
        if attachment is not None:
            session_actions.close_session(caller, session.id, reason="graph thread deleted", runtime_id=attachment.id)
        session_actions.forget_session(caller, session.id)
    return session.id


# ---- copy, prune, delete for runs (LangGraph's extended checkpointer capabilities) --------------------------
#: LangGraph's prune strategies: ``keep_latest`` keeps each namespace's latest checkpoint (what the
#: graph resumes from) and its pending writes; ``delete`` removes every checkpoint of the thread.
PRUNE_STRATEGIES = ("keep_latest", "delete")
#: How many thread ids one prune, and run ids one delete for runs, may name.
MAX_THREADS_PER_CALL = 200
MAX_RUN_IDS_PER_CALL = 200
_CP = Checkpoint._meta.db_table
_RT = RuntimeAttachment._meta.db_table


@dataclass(frozen=True)
class Copied:
    """A thread copied into a new one: the new session, its runtime (generation 1) and run, and what was copied."""

    thread: GraphThread
    run_id: int
    runtime_id: int | None
    source_session_id: int
    checkpoints: int
    writes: int


@dataclass(frozen=True)
class Removed:
    """What a prune or a delete for runs removed from one thread (and said in its session's timeline)."""

    thread_id: str
    session_id: int
    checkpoints: int
    writes: int
    channel_versions: int
    run_ids: tuple[str, ...] = ()

    @property
    def anything(self) -> bool:
        return bool(self.checkpoints or self.writes or self.channel_versions)


#: A thread's copy, one statement (one snapshot of the source): the source's graph checkpoints
#: become bounded checkpoints 1…n of the new session's run 1 (in the order they were recorded,
#: each with the source's cursor, refs and bindings) with their graph rows, its channel versions
#: and pending writes are the target's too, and the run's count and cursor follow the last copied
#: checkpoint. Blobs are project artifacts named by fingerprint: shared, never copied.
_COPY_THREAD_SQL = f"""
WITH src AS MATERIALIZED (
    SELECT o.record_id, o.graph_id, row_number() OVER () AS n,
           nextval(pg_get_serial_sequence('{_CP}', 'id')) AS new_id
      FROM (SELECT g.record_id, g.id AS graph_id FROM {_GC} g WHERE g.thread_id = %(source)s ORDER BY g.record_id) o
), records AS (
    INSERT INTO {_CP} (id, session_id, run_id, seq, boundary, cursor, artifacts, authority, pending, approvals,
                       resume_policy, schema_version, size_bytes, created_at, idempotency_key, request_digest)
    SELECT src.new_id, %(session)s, %(run)s, src.n, c.boundary, c.cursor, c.artifacts, c.authority, c.pending,
           c.approvals, c.resume_policy, c.schema_version, c.size_bytes, now(), NULL, NULL
      FROM src JOIN {_CP} c ON c.id = src.record_id
    RETURNING seq, cursor
), graphs AS (
    INSERT INTO {_GC} (thread_id, record_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, metadata, document,
                       created_at)
    SELECT %(target)s, src.new_id, g.checkpoint_ns, g.checkpoint_id, g.parent_checkpoint_id, g.metadata, g.document, now()
      FROM src JOIN {_GC} g ON g.id = src.graph_id
    RETURNING 1
), versions AS (
    INSERT INTO {_GB} (thread_id, checkpoint_ns, channel, version, fingerprint)
    SELECT %(target)s, b.checkpoint_ns, b.channel, b.version, b.fingerprint FROM {_GB} b WHERE b.thread_id = %(source)s
    RETURNING 1
), writes AS (
    INSERT INTO {_GW} (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, value_id, scalar,
                       created_at)
    SELECT %(target)s, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.task_path, w.idx, w.channel, w.value_id,
           w.scalar, now()
      FROM {_GW} w WHERE w.thread_id = %(source)s
    RETURNING 1
), run AS (
    UPDATE {_RUN} r SET checkpoint_count = (SELECT count(*) FROM src),
           cursor = COALESCE((SELECT x.cursor FROM records x ORDER BY x.seq DESC LIMIT 1), r.cursor)
     WHERE r.id = %(run)s
    RETURNING 1
)
SELECT (SELECT count(*) FROM graphs), (SELECT count(*) FROM writes), (SELECT count(*) FROM versions),
       (SELECT count(*) FROM run)
"""


def copy_thread(caller: Caller, source_thread_id: str, target_thread_id: str) -> Copied:
    """Copy a thread's history into a new thread: a new session, opened as a new thread is (runtime
    generation 1, run 1) with the source session's spec (role, memory policy, task mode, runtime
    family; the capabilities and lease of its latest runtime), whose history starts from the copy:
    every graph checkpoint (as a bounded checkpoint of run 1, citing the same blobs), channel
    version and pending write of the source. One transaction; the source is not changed.

    Refusals, writing nothing: invalid ids (422) → a token bound to a session (403: opening a
    thread opens a session) → the source is not a thread in the caller's reach (404) → the
    target id is a thread of the project already (409 ``graph_thread_exists``)."""
    caller.require("write")
    _path(source_thread_id, "source_thread_id")
    _path(target_thread_id, "target_thread_id")
    with transaction.atomic():
        source = find_thread(caller, source_thread_id)
        if source is None:
            raise NotFound("graph thread not found", thread_id=source_thread_id)
        if GraphThread.objects.filter(project_id=source.project_id, thread_id=target_thread_id).exists():
            raise GraphThreadExists("a graph thread with this id exists already: a copy opens a new one",
                                    thread_id=target_thread_id)
        origin = source.session
        runtime = RuntimeAttachment.objects.filter(session_id=origin.id).order_by("-generation").first()
        spec = ThreadSpec(role=origin.role, memory_policy=origin.memory_policy, task_mode=origin.task_mode,
                          runtime_family=origin.runtime_family,
                          capabilities=list(runtime.capabilities) if runtime is not None else [],
                          lease_seconds=runtime.lease_seconds if runtime is not None else None)
        thread, runtime_id = _open_thread(caller, target_thread_id, spec)
        if runtime_id is None:  # another request opened the target first
            raise GraphThreadExists("a graph thread with this id exists already: a copy opens a new one",
                                    thread_id=target_thread_id)
        run_id = Run.objects.filter(session_id=thread.session_id, state=rt.RunState.OPEN.value).values_list(
            "id", flat=True).get()
        [(checkpoints, writes, _, _)] = commit.fetch_prepared(_COPY_THREAD_SQL, {
            "source": source.id, "target": thread.id, "session": thread.session_id, "run": run_id,
        })
        outbox = Outbox(caller.label)
        outbox.add(thread.session, ev.GRAPH_THREAD_COPIED, run_id=run_id, thread_id=target_thread_id,
                   source_thread_id=source_thread_id, source_session_id=origin.id, checkpoints=checkpoints,
                   writes=writes)
        outbox.flush()
    return Copied(thread, run_id, runtime_id, origin.id, checkpoints, writes)


#: The sessions of the caller's threads a removal may touch (no lock: their ordering locks are
#: taken next, then this statement's rows are locked again), ``{where}`` on the thread ``t``.
_THREADS_IN_REACH_SQL = f"""
SELECT DISTINCT t.session_id FROM {_GT} t
 WHERE t.project_id = ANY(%(projects)s) AND (%(bound)s::bigint IS NULL OR t.session_id = %(bound)s::bigint)
   AND {{where}}
"""
#: Those threads' sessions locked (after their ordering locks, in id order: two removals never
#: wait on each other in a cycle), still in reach.
_LOCK_THREADS_SQL = f"""
SELECT t.id, t.thread_id, s.id, s.project_id FROM {_GT} t JOIN {Session._meta.db_table} s ON s.id = t.session_id
 WHERE t.session_id = ANY(%(sessions)s) AND t.project_id = ANY(%(projects)s)
   AND (%(bound)s::bigint IS NULL OR t.session_id = %(bound)s::bigint)
 ORDER BY s.id
   FOR UPDATE OF s
"""


def _lock_threads(caller: Caller, where: str, params: dict[str, Any]) -> list[tuple[int, str, int, int]]:
    """Lock the sessions of the caller's threads matching ``where`` (SQL on the thread ``t``):
    (thread pk, thread id, session id, project id), in session order; none when it reaches none."""
    reach = {"projects": list(caller.project_ids), "bound": caller.session_id}
    sessions = [r[0] for r in commit.fetch_prepared(_THREADS_IN_REACH_SQL.format(where=where), {**params, **reach})]
    if not sessions:
        return []
    events.order_lock(*sessions)
    return [tuple(r) for r in commit.fetch_prepared(_LOCK_THREADS_SQL, {"sessions": sessions, **reach})]


#: Remove graph checkpoints of locked threads, one statement: ``doomed`` (the checkpoints that
#: go, ``{doomed}`` on ``c``) and their graph rows; the pending writes ``{writes}`` names (on
#: ``w``, with ``kept``: each namespace's latest surviving checkpoint id); their bounded
#: checkpoint records, except one a later run resumed from (that run's provenance stays; the
#: record outlives its graph row, as a wait's checkpoint has none); and the channel versions no
#: surviving checkpoint names (a future put finds an unchanged channel at a version its parent
#: names). Blobs stay: they are project artifacts. Per thread: (pk, checkpoints, writes,
#: channel versions, the run ids of the removed checkpoints).
_REMOVE_SQL = f"""
WITH doomed AS MATERIALIZED (
    SELECT c.id, c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.record_id, c.metadata ->> 'run_id' AS run_id
      FROM {_GC} c
     WHERE c.thread_id = ANY(%(threads)s) AND {{doomed}}
), kept AS MATERIALIZED (
    SELECT c.thread_id, c.checkpoint_ns, max(c.checkpoint_id) AS checkpoint_id FROM {_GC} c
     WHERE c.thread_id = ANY(%(threads)s) AND c.id NOT IN (SELECT d.id FROM doomed d)
     GROUP BY c.thread_id, c.checkpoint_ns
), named AS MATERIALIZED (
    SELECT c.thread_id, c.checkpoint_ns, e.key AS channel, e.value AS version FROM {_GC} c
     CROSS JOIN LATERAL jsonb_each(CASE WHEN jsonb_typeof(c.document -> 'channel_versions') = 'object'
                                        THEN c.document -> 'channel_versions' ELSE '{{{{}}}}'::jsonb END) e
     WHERE c.thread_id = ANY(%(threads)s) AND c.id NOT IN (SELECT d.id FROM doomed d)
), graphs AS (
    DELETE FROM {_GC} c USING doomed d WHERE c.id = d.id RETURNING c.thread_id
), records AS (
    DELETE FROM {_CP} x USING doomed d WHERE x.id = d.record_id
       AND NOT EXISTS (SELECT 1 FROM {_RUN} r WHERE r.resumed_from_id = x.id)
    RETURNING x.id
), writes AS (
    DELETE FROM {_GW} w WHERE w.thread_id = ANY(%(threads)s) AND ({{writes}})
    RETURNING w.thread_id
), versions AS (
    DELETE FROM {_GB} b WHERE b.thread_id = ANY(%(threads)s)
       AND NOT EXISTS (SELECT 1 FROM named n WHERE n.thread_id = b.thread_id AND n.checkpoint_ns = b.checkpoint_ns
                                              AND n.channel = b.channel AND n.version = b.version::jsonb)
    RETURNING b.thread_id
)
SELECT t.id,
       (SELECT count(*) FROM graphs g WHERE g.thread_id = t.id),
       (SELECT count(*) FROM writes w WHERE w.thread_id = t.id),
       (SELECT count(*) FROM versions v WHERE v.thread_id = t.id),
       (SELECT coalesce(array_agg(DISTINCT d.run_id ORDER BY d.run_id) FILTER (WHERE d.run_id IS NOT NULL), '{{{{}}}}')
          FROM doomed d WHERE d.thread_id = t.id),
       (SELECT count(*) FROM records)
  FROM unnest(%(threads)s::bigint[]) AS t(id)
"""
#: What each removal removes: (the checkpoints that go, the pending writes that go).
_REMOVALS = {
    # every checkpoint but each namespace's latest, and the writes keyed below it (its own stay,
    # and so do writes of a checkpoint not landed yet: graphs store checkpoints in the background)
    "keep_latest": ("EXISTS (SELECT 1 FROM {gc} l WHERE l.thread_id = c.thread_id AND l.checkpoint_ns = c.checkpoint_ns "
                    "AND l.checkpoint_id > c.checkpoint_id)",
                    "EXISTS (SELECT 1 FROM kept k WHERE k.thread_id = w.thread_id AND k.checkpoint_ns = w.checkpoint_ns "
                    "AND w.checkpoint_id < k.checkpoint_id)"),
    "delete": ("true", "true"),
    # the checkpoints LangGraph's metadata says these runs wrote, and their writes
    "runs": ("c.metadata ->> 'run_id' = ANY(%(run_ids)s)",
             "EXISTS (SELECT 1 FROM doomed d WHERE d.thread_id = w.thread_id AND d.checkpoint_ns = w.checkpoint_ns "
             "AND d.checkpoint_id = w.checkpoint_id)"),
}
_REMOVE_SQLS = {kind: _REMOVE_SQL.format(doomed=doomed.format(gc=_GC), writes=writes.format(gc=_GC))
                for kind, (doomed, writes) in _REMOVALS.items()}


def _remove(kind: str, locked: list[tuple[int, str, int, int]], params: dict[str, Any]) -> list[tuple[Removed, Session]]:
    """Run removal ``kind`` on the locked threads: what went from each, with its session (for its event)."""
    if not locked:
        return []
    rows = {r[0]: r for r in commit.fetch_prepared(_REMOVE_SQLS[kind], {**params, "threads": [t[0] for t in locked]})}
    removed = []
    for pk, thread_id, session_id, project_id in locked:
        _, checkpoints, writes, versions, run_ids, _ = rows[pk]
        removed.append((Removed(thread_id, session_id, checkpoints, writes, versions, tuple(run_ids)),
                        Session(id=session_id, project_id=project_id)))
    return removed


def _counts(item: Removed) -> dict[str, Any]:
    return {"thread_id": item.thread_id, "checkpoints": item.checkpoints, "writes": item.writes,
            "channel_versions": item.channel_versions}


def prune(caller: Caller, thread_ids: list[str], strategy: str = "keep_latest") -> list[Removed]:
    """Prune the caller's threads among ``thread_ids`` (LangGraph's ``prune``): ``keep_latest``
    keeps each namespace's latest checkpoint with its pending writes (what the graph, and the
    session's resume, continue from); ``delete`` removes every checkpoint and write of the thread
    (the session stays: its next put starts a fresh history). Channel versions no kept checkpoint
    names go too; blobs stay (project artifacts). One transaction under the threads' session
    locks; each thread that lost something says so in its session's timeline (``graph.pruned``).
    A thread id the caller does not reach is left alone, as one that does not exist: nothing is
    written for it. Returns what went, per thread reached."""
    caller.require("write")
    if strategy not in PRUNE_STRATEGIES:
        raise ValidationFailed(f"strategy is one of {', '.join(PRUNE_STRATEGIES)}", field="strategy")
    ids = _ids(thread_ids, "thread_ids", MAX_THREADS_PER_CALL, _path)
    if not ids:
        return []
    with transaction.atomic():
        removed = _remove(strategy, _lock_threads(caller, "t.thread_id = ANY(%(ids)s)", {"ids": ids}), {})
        outbox = Outbox(caller.label)
        for item, session in removed:
            if item.anything:
                outbox.add(session, ev.GRAPH_PRUNED, strategy=strategy, **_counts(item))
        if outbox.items:
            outbox.flush()
    return [item for item, _ in removed]


def delete_for_runs(caller: Caller, run_ids: list[str]) -> list[Removed]:
    """Delete the graph checkpoints whose metadata ``run_id`` is among ``run_ids``, in every thread
    the caller reaches, with their pending writes (LangGraph's ``delete_for_runs``); channel
    versions no remaining checkpoint names go too. One transaction; each thread that lost
    something says so in its session's timeline (``graph.runs_deleted``). Returns what went, per
    thread."""
    caller.require("write")
    ids = _ids(run_ids, "run_ids", MAX_RUN_IDS_PER_CALL)
    if not ids:
        return []
    with transaction.atomic():
        locked = _lock_threads(
            caller, f"t.id IN (SELECT c.thread_id FROM {_GC} c WHERE c.metadata ->> 'run_id' = ANY(%(run_ids)s))",
            {"run_ids": ids})
        removed = _remove("runs", locked, {"run_ids": ids})
        outbox = Outbox(caller.label)
        for item, session in removed:
            if item.anything:
                outbox.add(session, ev.GRAPH_RUNS_DELETED, run_ids=list(item.run_ids), **_counts(item))
        if outbox.items:
            outbox.flush()
    return [item for item, _ in removed]


def _ids(values: list[str], field_name: str, limit: int, each: Callable[[Any, str], str] = _name) -> list[str]:
    if not isinstance(values, list) or len(values) > limit:
        raise ValidationFailed(f"{field_name} is a list of at most {limit} ids", field=field_name, limit=limit)
    return sorted({each(v, f"{field_name}[{i}]") for i, v in enumerate(values)})
