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
  its value a blob too; ``(task_id, idx)`` is stored once (LangGraph's special channels, negative
  ``idx``, keep their latest value);
* **deleting a thread** closes the session's live runtime and forgets the session (its runs,
  checkpoints and graph rows); blobs are project artifacts and stay.

Resuming a thread is resuming its session (``control/resume.py``): the revalidation report
decides, then generation N+1 and a new run take the thread's next checkpoints.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet

from novelforge_sessions import session_runtime as rt
from novelforge_sessions.access import Caller
from novelforge_sessions.actions import runs as run_actions
from novelforge_sessions.actions import sessions as session_actions
from novelforge_sessions.actions.artifacts import MAX_ARTIFACT_BYTES
from novelforge_sessions.actions.lifecycle import check, live_runtime, lock_session, open_run
from novelforge_sessions.actions.runtimes import MAX_LEASE_SECONDS, RuntimeSpec
from novelforge_sessions.control.checkpoints import record_checkpoint
from novelforge_sessions.control.models import GraphBlob, GraphCheckpoint, GraphThread, GraphWrite
from novelforge_sessions.errors import GraphCheckpointConflict, NoOpenRun, NotFound, ServiceError, ValidationFailed
from novelforge_sessions.models import Artifact, ArtifactVersion, Project, content_fingerprint

#: The artifact kind of state blobs, and the prefix of their names (``blob:<fingerprint>``).
BLOB_KIND = "graph-blob"
BLOB_PREFIX = "blob:"
#: Bounds of the graph's own bookkeeping (the checkpoint document without values; metadata).
MAX_METADATA_BYTES = 16 * 1024
MAX_ID_LENGTH = 64
MAX_NAME_LENGTH = 200
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


@dataclass(frozen=True)
class Blob:
    """A serialized value: the graph serializer's type tag and the bytes, base64-encoded."""

    serde: str
    data: str

    def content(self) -> str:
        return json.dumps({"serde": self.serde, "data": self.data}, sort_keys=True, separators=(",", ":"))


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
    """A channel's new value at a new version (LangGraph's ``new_versions``)."""

    channel: str
    version: Any
    value: Blob


@dataclass(frozen=True)
class WriteSpec:
    idx: int
    channel: str
    value: Blob


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


# ---- validation (before any transaction) ------------------------------------------------------------
def _name(value: Any, field_name: str, *, max_length: int = MAX_NAME_LENGTH, empty: bool = False) -> str:
    if not isinstance(value, str) or len(value) > max_length or (not value and not empty):
        raise ValidationFailed(f"{field_name} must be a string of {0 if empty else 1}–{max_length} characters",
                               field=field_name)
    return value


def _blob(value: Blob, field_name: str) -> Blob:
    _name(value.serde, f"{field_name}.serde", max_length=64)
    try:
        base64.b64decode(value.data, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationFailed(f"{field_name}.data must be base64", field=f"{field_name}.data") from None
    if len(value.content()) > MAX_ARTIFACT_BYTES:
        raise ValidationFailed(f"{field_name} is over {MAX_ARTIFACT_BYTES} bytes", field=field_name)
    return value


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


def _channel_fingerprints(thread: GraphThread, checkpoint_ns: str, versions: Mapping[str, Any]) -> dict[str, str]:
    """channel → fingerprint of its value at the checkpoint's version (channels with no stored
    value at that version are absent, as LangGraph expects). One query."""
    if not versions:
        return {}
    wanted = Q()
    for channel, version in versions.items():
        wanted |= Q(channel=channel, version=json.dumps(version))
    rows = GraphBlob.objects.filter(wanted, thread=thread, checkpoint_ns=checkpoint_ns).values_list(
        "channel", "version", "fingerprint")
    found = {(ch, v): fp for ch, v, fp in rows}
    return {ch: found[(ch, json.dumps(v))] for ch, v in sorted(versions.items()) if (ch, json.dumps(v)) in found}


# ---- blobs ---------------------------------------------------------------------------------------------
def _store_blobs(project: Project, blobs: Iterable[Blob], actor: str) -> dict[str, ArtifactVersion]:
    """Content → its artifact version, creating the missing ones (one artifact per distinct content)."""
    by_fp = {content_fingerprint(b.content().encode()): b for b in blobs}
    if not by_fp:
        return {}
    found = {
        v.fingerprint: v for v in ArtifactVersion.objects.filter(
            artifact__project=project, artifact__name__in=[BLOB_PREFIX + fp for fp in by_fp], number=1,
        )
    }
    for fp, blob in by_fp.items():
        if fp in found:
            continue
        try:
            # A savepoint per blob: a concurrent writer storing the same content wins the name's
            # unique constraint, and this one reads the winner's (committed) version.
            with transaction.atomic():
                artifact = Artifact.objects.create(project=project, name=BLOB_PREFIX + fp, kind=BLOB_KIND)
                version = ArtifactVersion.objects.create(
                    artifact=artifact, number=1, content=blob.content(), fingerprint=fp, created_by=actor,
                )
                Artifact.objects.filter(id=artifact.id).update(current_version=version)
        except IntegrityError:
            version = ArtifactVersion.objects.get(artifact__project=project, artifact__name=BLOB_PREFIX + fp, number=1)
        found[fp] = version
    return found


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
    _name(thread_id, "thread_id")
    _check_open(spec)
    with transaction.atomic():
        return _open_thread(caller, thread_id, spec)


# ---- checkpoints ------------------------------------------------------------------------------------------
def put_checkpoint(
    caller: Caller, *, thread_id: str, checkpoint_ns: str, checkpoint_id: str, parent_checkpoint_id: str | None,
    checkpoint: Mapping[str, Any], metadata: Mapping[str, Any] | None, blobs: list[ChannelBlob],
    open_spec: ThreadSpec | None,
) -> Stored:
    """Record one graph checkpoint as a bounded checkpoint of the thread's open run.

    Refusals, writing nothing: invalid ids, blobs or bookkeeping (422) → the thread is unknown
    and ``open_spec`` is None (404) → the session has no open run (409 ``no_open_run``: resume
    it) → the id already names a different checkpoint (409 ``graph_checkpoint_conflict``).
    A retried identical put returns the stored checkpoint.
    """
    caller.require("write")
    _name(thread_id, "thread_id")
    _name(checkpoint_ns, "checkpoint_ns", empty=True)
    _name(checkpoint_id, "checkpoint_id", max_length=MAX_ID_LENGTH)
    parent = _name(parent_checkpoint_id or "", "parent_checkpoint_id", max_length=MAX_ID_LENGTH, empty=True)
    for i, b in enumerate(blobs):
        _name(b.channel, f"blobs[{i}].channel")
        _version_key(b.version, f"blobs[{i}].version")
        _blob(b.value, f"blobs[{i}]")
    document = _document(checkpoint)
    meta = check(rt.validate_metadata, dict(metadata or {}), "metadata", MAX_METADATA_BYTES)
    _check_open(open_spec)
    if open_spec is not None:
        # Its own transaction, committed first: a loser of the race to open the thread has then
        # written nothing when it takes the winner's session ordering lock (events.order_lock).
        thread, opened_runtime = _open_thread(caller, thread_id, open_spec)
    with transaction.atomic():
        if open_spec is None:
            thread, opened_runtime = find_thread(caller, thread_id), None
            if thread is None:
                raise NotFound("graph thread not found", thread_id=thread_id)
        # The session lock serialises the thread's writers (lock order: session, then run).
        session = lock_session(caller, thread.session_id)
        _store_blobs(session.project, (b.value for b in blobs), caller.label)
        for b in blobs:
            # The latest value at a (channel, version) stands, as in LangGraph's own savers.
            GraphBlob.objects.update_or_create(
                thread=thread, checkpoint_ns=checkpoint_ns, channel=b.channel, version=json.dumps(b.version),
                defaults={"fingerprint": content_fingerprint(b.value.content().encode())},
            )
        fps = _channel_fingerprints(thread, checkpoint_ns, document.get("channel_versions") or {})
        document["blobs"] = fps
        existing = GraphCheckpoint.objects.filter(thread=thread, checkpoint_ns=checkpoint_ns,
                                                  checkpoint_id=checkpoint_id).first()
        if existing is not None:
            if (existing.parent_checkpoint_id, existing.document, existing.metadata) != (parent, document, meta):
                raise GraphCheckpointConflict("this graph checkpoint id already names a different checkpoint",
                                              thread_id=thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id)
            return Stored(existing, thread, opened_runtime, False)
        run = open_run(session)
        if run is None:
            raise NoOpenRun("the thread's session has no open run: resume the session first",
                            status=session.status, session_id=session.id)
        artifact_ids = dict(ArtifactVersion.objects.filter(
            artifact__project_id=session.project_id, artifact__name__in=[BLOB_PREFIX + fp for fp in fps.values()], number=1,
        ).values_list("fingerprint", "artifact_id"))
        refs = sorted({(artifact_ids[fp], fp) for fp in fps.values()})
        cursor: dict[str, Any] = {"graph": {"checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}}
        if isinstance(meta.get("step"), int):
            cursor["graph"]["step"] = meta["step"]
        # The refs are this thread's own state blobs (their content came in this thread's puts,
        # which the caller reaches), not a citation of what another session holds: a blob stored
        # once per project may have been written first by another thread's token.
        record = record_checkpoint(caller, run.id, {
            "boundary": rt.CheckpointBoundary.CONTEXT_FREEZE.value, "cursor": cursor,
            "artifacts": [{"artifact_id": a, "fingerprint": fp} for a, fp in refs],
        }, refs_in_reach=True)
        graph = GraphCheckpoint.objects.create(
            thread=thread, record=record, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id,
            parent_checkpoint_id=parent, metadata=meta, document=document,
        )
    return Stored(graph, thread, opened_runtime, True)


def put_writes(
    caller: Caller, *, thread_id: str, checkpoint_ns: str, checkpoint_id: str, task_id: str, task_path: str,
    writes: list[WriteSpec], open_spec: ThreadSpec | None = None,
) -> int:
    """Store a task's pending writes against a graph checkpoint id; returns how many rows are new
    or updated. The checkpoint need not have landed yet (graphs store checkpoints in the
    background); an unknown thread is opened with ``open_spec``, else 404."""
    caller.require("write")
    _name(thread_id, "thread_id")
    _name(checkpoint_ns, "checkpoint_ns", empty=True)
    _name(checkpoint_id, "checkpoint_id", max_length=MAX_ID_LENGTH)
    _name(task_id, "task_id", max_length=MAX_ID_LENGTH)
    _name(task_path, "task_path", empty=True)
    for i, w in enumerate(writes):
        _name(w.channel, f"writes[{i}].channel")
        _blob(w.value, f"writes[{i}].value")
    _check_open(open_spec)
    if open_spec is not None:
        thread, _ = _open_thread(caller, thread_id, open_spec)  # committed first, as in put_checkpoint
    with transaction.atomic():
        if open_spec is None:
            thread = find_thread(caller, thread_id)
            if thread is None:
                raise NotFound("graph thread not found", thread_id=thread_id)
        session = lock_session(caller, thread.session_id)
        versions = _store_blobs(session.project, (w.value for w in writes), caller.label)
        changed = 0
        key = {"thread": thread, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id, "task_id": task_id}
        for w in writes:
            value = versions[content_fingerprint(w.value.content().encode())]
            defaults = {"channel": w.channel, "value": value, "task_path": task_path}
            if w.idx < 0:
                # LangGraph's special channels (error, interrupt, resume…): the latest value stands.
                GraphWrite.objects.update_or_create(**key, idx=w.idx, defaults=defaults)
                changed += 1
            else:
                # A repeated (task, idx) is the same write delivered again: stored once.
                _, created = GraphWrite.objects.get_or_create(**key, idx=w.idx, defaults=defaults)
                changed += int(created)
    return changed


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
    session's id, or None when no such thread exists (deleting nothing is not an error)."""
    caller.require("write")
    _name(thread_id, "thread_id")
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
