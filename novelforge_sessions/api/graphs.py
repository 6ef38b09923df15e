"""Graph threads over HTTP (the LangGraph checkpointer's server side, ``control/graphs.py``). Thin."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from django.conf import settings
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status

from novelforge_sessions.access import Caller
from novelforge_sessions.apikit.auth import RECALL
from novelforge_sessions.apikit.common import caller, errors
from novelforge_sessions import session_runtime as rt
from novelforge_sessions import tracing
from novelforge_sessions.api.schemas import CAPABILITIES, SHORT_NAME, Memory
from novelforge_sessions.apikit.schemas import (
    STORABLE_JSON_MARK, STORABLE_TEXT, X_MAX_BYTES, Strict, loads_json, max_bytes, page_limit,
    refuse_unstorable_text,
)
from novelforge_sessions.control import graphs as actions
from novelforge_sessions.control.models import GraphCheckpoint
from novelforge_sessions.errors import NotFound, ValidationFailed

router = Router(tags=["graph threads"])


#: A graph thread's session role: any session role but ``other`` (which needs a role extension).
GraphRole = Literal[tuple(r.value for r in rt.SessionRole if r is not rt.SessionRole.OTHER)]  # type: ignore[valid-type]


BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
FINGERPRINT = {"pattern": rt.FINGERPRINT_PATTERN}
#: A thread id, a checkpoint namespace or a task path: as many characters as bytes (``actions.MAX_PATH_LENGTH``).
PATH = max_bytes(actions.MAX_PATH_LENGTH)
NAMESPACE_DOC = "LangGraph's namespace of a subgraph (its parents' node names and task ids); empty at the top"


class GraphBlobIn(Strict):
    serde: str = Field(..., min_length=1, max_length=64, description="the graph serializer's type tag (LangGraph `dumps_typed`)")
    data: str = Field(..., max_length=actions.MAX_BLOB_DATA_CHARS,
                      description=f"the serialized bytes (at most {actions.MAX_BLOB_BYTES}), base64; a value that does "
                      "not fit in one request body is uploaded in chunks (`POST /graph-blobs`) and named by fingerprint",
                      json_schema_extra={"contentEncoding": "base64", "pattern": BASE64_PATTERN})


#: A blob is named by the sha256 of its content: the compact JSON ``{"data":…,"serde":…}``
#: (keys sorted, no spaces), as ``control/graphs.blob_content`` builds it.
FINGERPRINT_DOC = ('the fingerprint of a blob the project holds: `sha256:` and the hex sha256 of the compact JSON '
                   '`{"data":<base64>,"serde":<tag>}` (keys sorted, no spaces); unknown: 409 `graph_blob_missing`')
#: Exactly one of the value and the fingerprint (a write: or its scalar).
ONE_OF_VALUE = {"oneOf": [{"required": ["value"]}, {"required": ["fingerprint"]}]}
ONE_OF_WRITE_VALUE = {"oneOf": [{"required": ["value"]}, {"required": ["fingerprint"]}, {"required": ["scalar"]}]}


#: A channel version as ``control/graphs.py`` measures it (``_version_key``).
VERSION: dict[str, Any] = {"anyOf": [
    {"type": "integer", "minimum": actions.MIN_VERSION_NUMBER, "maximum": actions.MAX_VERSION_NUMBER},
    {"type": "number", "minimum": actions.MIN_VERSION_NUMBER, "maximum": actions.MAX_VERSION_NUMBER},
    {"type": "string", "maxLength": actions.MAX_VERSION_LENGTH, "pattern": actions.VERSION_TEXT_PATTERN},
]}
VERSION_DOC = (
    f"a number from {actions.MIN_VERSION_NUMBER} to {actions.MAX_VERSION_NUMBER} (kept as sent: `7.0` is not `7`), or "
    f'a string of at most {actions.MAX_VERSION_LENGTH} printable ASCII characters other than `"` and `\\`'
)


class GraphChannelBlobIn(Strict):
    model_config = {"json_schema_extra": ONE_OF_VALUE}

    channel: str = Field(..., min_length=1, max_length=200)
    version: int | float | str = Field(..., json_schema_extra=VERSION,
                                       description="the channel's new version (LangGraph `new_versions`): " + VERSION_DOC)
    value: GraphBlobIn | None = Field(None, description="the value inline (or `fingerprint`)")
    fingerprint: str | None = Field(None, description=FINGERPRINT_DOC, json_schema_extra=FINGERPRINT)


#: A channel value put inline (``values``): a small JSON scalar (``control/graphs.MAX_INLINE_*``).
InlineValue = (Annotated[int, Field(ge=-actions.MAX_INLINE_INT, le=actions.MAX_INLINE_INT)]
               | Annotated[str, Field(max_length=actions.MAX_INLINE_CHARS)] | bool | None)


class GraphThreadSpecIn(Strict):
    role: GraphRole = Field("specialist", description="the session's role (`other` needs an extension: not offered here)")
    memory_policy: Memory = "checkpoint_only"
    task_mode: str = Field("langgraph", max_length=64, json_schema_extra=SHORT_NAME)
    runtime_family: str = Field("langgraph", max_length=64, json_schema_extra=SHORT_NAME)
    capabilities: list[str] = Field(default_factory=list, json_schema_extra=CAPABILITIES)
    lease_seconds: int | None = Field(None, ge=1, le=3600)


class GraphPutIn(Strict):
    thread_id: str = Field(..., min_length=1, max_length=actions.MAX_PATH_LENGTH, json_schema_extra=PATH)
    checkpoint_ns: str = Field("", max_length=actions.MAX_PATH_LENGTH, description=NAMESPACE_DOC, json_schema_extra=PATH)
    checkpoint_id: str = Field(..., min_length=1, max_length=64)
    parent_checkpoint_id: str | None = Field(None, max_length=64)
    checkpoint: dict[str, Any] = Field(
        ..., description="the graph checkpoint without `channel_values` (versions, versions seen, ts, …); "
        "`channel_versions` maps channel names (1–200 characters) to versions: " + VERSION_DOC,
        json_schema_extra={
            X_MAX_BYTES: settings.CHECKPOINT_MAX_BYTES,
            "properties": {"channel_versions": {
                "type": "object", "additionalProperties": VERSION,
                "propertyNames": {"minLength": 1, "maxLength": actions.MAX_NAME_LENGTH, "pattern": STORABLE_TEXT},
            }},
            "not": {"required": ["channel_values"]},
            "propertyNames": {"pattern": STORABLE_TEXT},
            "additionalProperties": {STORABLE_JSON_MARK: True},
        })
    metadata: dict[str, Any] = Field(default_factory=dict, description="the graph's checkpoint metadata (filterable)",
                                     json_schema_extra=max_bytes(actions.MAX_METADATA_BYTES))
    blobs: list[GraphChannelBlobIn] = Field(
        default_factory=list, max_length=500,
        description="the channels that changed: their values at their new versions, stored as content-addressed "
        "artifacts; unchanged channels are found at the versions `checkpoint.channel_versions` names")
    values: dict[str, InlineValue] = Field(
        default_factory=dict, max_length=500,
        description="channels whose values are small JSON scalars (`null`, a boolean, an integer of at most 2**53 in "
        f"magnitude, a string of at most {actions.MAX_INLINE_CHARS} characters), kept in the checkpoint itself as "
        "LangGraph's own PostgreSQL saver keeps them: no blob. Each names a channel of `checkpoint.channel_versions` "
        "that `blobs` does not carry; unchanged ones are sent again with each put. Read back as the checkpoint's "
        "`channel_values`",
        json_schema_extra={**max_bytes(actions.MAX_INLINE_VALUES_BYTES),
                           "propertyNames": {"minLength": 1, "maxLength": actions.MAX_NAME_LENGTH,
                                             "pattern": STORABLE_TEXT}})
    open: GraphThreadSpecIn | None = Field(
        None, description="open the thread's session (runtime generation 1, run 1) if the thread is new; "
        "without it an unknown thread is 404. Opening creates a session: a token bound to a session may not (403 "
        "`forbidden`, nothing written), whether the id is unused or another session's thread")
    writes: list["GraphTaskWritesIn"] = Field(
        default_factory=list, max_length=actions.MAX_PUT_TASK_WRITES,
        description="tasks' pending writes that came before this checkpoint (as `POST /graph-threads/writes` would "
        "store them), stored first in the same transaction: one request per superstep. A value inline here may be "
        "named by fingerprint in `blobs`. Refused or rolled back with the put")


class GraphPutOut(Schema):
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    session_id: int
    run_id: int
    record_id: int = Field(..., description="the bounded checkpoint (`GET /checkpoints/{id}`)")
    created: bool = Field(..., description="false: an identical put was already stored")
    runtime_id: int | None = Field(None, description="runtime generation 1's id when this put opened the thread")


class GraphWriteIn(Strict):
    model_config = {"json_schema_extra": ONE_OF_WRITE_VALUE}

    idx: int = Field(..., ge=-(2**31), le=2**31 - 1, description="the write's index in the task (LangGraph's special "
                     "channels use negative ones)")
    channel: str = Field(..., min_length=1, max_length=200)
    value: GraphBlobIn | None = Field(None, description="the value inline (or `fingerprint`, or `scalar`)")
    fingerprint: str | None = Field(None, description=FINGERPRINT_DOC, json_schema_extra=FINGERPRINT)
    scalar: InlineValue = Field(
        None, description=f"the value itself, kept in the write's row with no blob, when it is a small JSON scalar: "
        f"`null` (present), a boolean, an integer of at most 2**53 in magnitude or a string of at most "
        f"{actions.MAX_INLINE_CHARS} characters, on a channel not named like a conversation (`messages`, `history`, …)")


class GraphTaskWritesIn(Strict):
    checkpoint_id: str = Field(..., min_length=1, max_length=64, description="the checkpoint the writes belong to "
                               "(the task ran from it: usually the put's parent)")
    task_id: str = Field(..., min_length=1, max_length=64)
    task_path: str = Field("", max_length=actions.MAX_PATH_LENGTH, json_schema_extra=PATH)
    writes: list[GraphWriteIn] = Field(..., max_length=200)


GraphPutIn.model_rebuild()


class GraphWritesIn(Strict):
    thread_id: str = Field(..., min_length=1, max_length=actions.MAX_PATH_LENGTH, json_schema_extra=PATH)
    checkpoint_ns: str = Field("", max_length=actions.MAX_PATH_LENGTH, description=NAMESPACE_DOC, json_schema_extra=PATH)
    checkpoint_id: str = Field(..., min_length=1, max_length=64)
    task_id: str = Field(..., min_length=1, max_length=64)
    task_path: str = Field("", max_length=actions.MAX_PATH_LENGTH, json_schema_extra=PATH)
    writes: list[GraphWriteIn] = Field(..., max_length=200)
    open: GraphThreadSpecIn | None = Field(
        None, description="open the thread's session if the thread is new (as for a put; a token bound to a session "
        "may not: 403 `forbidden`)")


class GraphWritesOut(Schema):
    stored: int


class GraphBlobChunkIn(Strict):
    fingerprint: str = Field(..., description="the whole blob's fingerprint (checked when its last chunk arrives)",
                             json_schema_extra=FINGERPRINT)
    serde: str = Field(..., min_length=1, max_length=64, description="the graph serializer's type tag, the same on every chunk")
    index: int = Field(..., ge=0, lt=actions.MAX_CHUNKS, description="this chunk's place, from 0 to `count` - 1")
    count: int = Field(..., ge=1, le=actions.MAX_CHUNKS, description="how many chunks the blob has, the same on every chunk")
    data: str = Field(..., max_length=actions.MAX_CHUNK_CHARS,
                      description="this chunk of the blob's base64 text: whole base64 quanta (a multiple of 4 characters)",
                      json_schema_extra={"contentEncoding": "base64", "pattern": BASE64_PATTERN})


class GraphBlobChunkOut(Schema):
    fingerprint: str
    complete: bool = Field(..., description="the blob is stored (now or before): it may be named by fingerprint")
    received: int = Field(..., description="chunks staged so far (all of them once complete)")


class GraphBlobsAskIn(Strict):
    fingerprints: list[str] = Field(..., max_length=actions.MAX_ASKED_FINGERPRINTS,
                                    json_schema_extra={"items": {"type": "string", **FINGERPRINT}})


class GraphBlobsMissingOut(Schema):
    missing: list[str] = Field(..., description="the fingerprints asked about that name no blob of the project, sorted")


class GraphBlobOut(Schema):
    fingerprint: str
    serde: str
    data: str


class GraphPendingWriteOut(Schema):
    task_id: str
    task_path: str
    idx: int
    channel: str
    fingerprint: str | None = Field(..., description="the value's blob (`serde`, `data`); null when it was written "
                                    "as a `scalar`")
    serde: str | None
    data: str | None
    scalar: InlineValue = Field(None, description="the value written as a scalar (when `fingerprint` is null)")


class GraphCheckpointOut(Schema):
    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    session_id: int
    run_id: int
    record_id: int
    metadata: dict[str, Any]
    checkpoint: dict[str, Any] = Field(..., description="as put; `channel_values` holds the values put inline (`values`), `blobs` maps each "
                                          "other channel → its fingerprint")
    blobs: dict[str, GraphBlobOut]
    pending_writes: list[GraphPendingWriteOut]
    created_at: datetime


class GraphListOut(Schema):
    items: list[GraphCheckpointOut]


class GraphThreadOut(Schema):
    thread_id: str
    session_id: int
    created_at: datetime


class GraphDeleteOut(Schema):
    deleted: bool
    session_id: int | None


class GraphCopyIn(Strict):
    source_thread_id: str = Field(..., min_length=1, max_length=actions.MAX_PATH_LENGTH, json_schema_extra=PATH,
                                  description="the thread whose history is copied")
    target_thread_id: str = Field(..., min_length=1, max_length=actions.MAX_PATH_LENGTH, json_schema_extra=PATH,
                                  description="the new thread's id (a thread of the project already: 409 `graph_thread_exists`)")


class GraphCopyOut(Schema):
    thread_id: str
    session_id: int = Field(..., description="the new thread's session, opened with the source session's spec")
    run_id: int = Field(..., description="its run 1, holding the copied checkpoints; the thread's next checkpoints follow")
    runtime_id: int | None = Field(..., description="its runtime generation 1")
    source_thread_id: str
    source_session_id: int
    checkpoints: int = Field(..., description="graph checkpoints copied (each a bounded checkpoint of the new run)")
    writes: int = Field(..., description="pending writes copied")


class GraphPruneIn(Strict):
    thread_ids: list[str] = Field(..., max_length=actions.MAX_THREADS_PER_CALL, json_schema_extra={"items": {
                                      "type": "string", "minLength": 1, "maxLength": actions.MAX_PATH_LENGTH, **PATH}},
                                  description="the threads to prune; an id the token does not reach is left alone")
    strategy: Literal[actions.PRUNE_STRATEGIES] = Field(  # type: ignore[valid-type]
        "keep_latest", description="`keep_latest`: each namespace keeps its latest checkpoint and that checkpoint's "
        "pending writes (what the graph and the session's resume continue from); `delete`: every checkpoint and write")


class GraphRunsDeleteIn(Strict):
    run_ids: list[str] = Field(..., max_length=actions.MAX_RUN_IDS_PER_CALL,
                               json_schema_extra={"items": {"type": "string", "minLength": 1, "maxLength": 200}},
                               description="LangGraph run ids (checkpoint metadata `run_id`)")


class GraphRemovedOut(Schema):
    thread_id: str
    session_id: int
    checkpoints: int = Field(..., description="graph checkpoints removed (with their bounded checkpoints)")
    writes: int = Field(..., description="pending writes removed")
    channel_versions: int = Field(..., description="channel versions no remaining checkpoint names, removed (the blobs "
                                  "themselves are project artifacts and stay)")
    run_ids: list[str] = Field(..., description="the run ids of the removed checkpoints")


class GraphRemovedListOut(Schema):
    threads: list[GraphRemovedOut] = Field(..., description="each thread reached, in session order")


def _blob(b: GraphBlobIn | None) -> actions.Blob | None:
    return actions.Blob(serde=b.serde, data=b.data) if b is not None else None


def _write(w: GraphWriteIn) -> actions.WriteSpec:
    """A write as sent; its ``scalar`` counts when present, ``null`` included."""
    return actions.WriteSpec(idx=w.idx, channel=w.channel, value=_blob(w.value), fingerprint=w.fingerprint,
                             scalar=actions.Scalar(w.scalar) if "scalar" in w.model_fields_set else None)


def _out(items: list[GraphCheckpoint], project_ids) -> list[dict[str, Any]]:
    contents = actions.blob_contents(project_ids, {fp for g in items for fp in g.document.get("blobs", {}).values()})
    pending = actions.writes_of(items)
    out = []
    for g in items:
        blobs = {}
        for channel, fp in g.document.get("blobs", {}).items():
            blobs[channel] = {"fingerprint": fp, **contents[fp]}
        writes = []
        for w in pending.get((g.thread_id, g.checkpoint_ns, g.checkpoint_id), []):
            write = {"task_id": w.task_id, "task_path": w.task_path, "idx": w.idx, "channel": w.channel}
            if w.value is None:
                write.update(fingerprint=None, serde=None, data=None, scalar=json.loads(w.scalar))
            else:
                write.update(fingerprint=w.value.fingerprint, **json.loads(w.value.content))
            writes.append(write)
        out.append({
            "thread_id": g.thread.thread_id, "checkpoint_ns": g.checkpoint_ns, "checkpoint_id": g.checkpoint_id,
            "parent_checkpoint_id": g.parent_checkpoint_id or None, "session_id": g.thread.session_id,
            "run_id": g.record.run_id, "record_id": g.record_id, "metadata": g.metadata, "checkpoint": g.document,
            "blobs": blobs, "pending_writes": writes, "created_at": g.created_at,
        })
    return out


@router.post(
    "/graph-threads/checkpoints", response={200: GraphPutOut, 201: GraphPutOut, **errors(403, 404, 409, 413)},
    auth=RECALL,
    summary="Put a graph checkpoint (a LangGraph thread is a session; 201 new, 200 an identical retry)",
)
def put_checkpoint(request: HttpRequest, body: GraphPutIn):
    return Status(*put_answer(caller(request), body))


def put_answer(who: Caller, body: GraphPutIn) -> tuple[int, dict[str, Any]]:
    """The put route's action and answer (201 new, 200 an identical retry): this route's and the
    API socket's (``api/socket.py``)."""
    open_spec = actions.ThreadSpec(**body.open.model_dump()) if body.open is not None else None
    with tracing.span("graph_put", blobs=len(body.blobs), writes=sum(len(t.writes) for t in body.writes)) as span:
        stored = actions.put_checkpoint(
            who, thread_id=body.thread_id, checkpoint_ns=body.checkpoint_ns,
            checkpoint_id=body.checkpoint_id, parent_checkpoint_id=body.parent_checkpoint_id,
            checkpoint=body.checkpoint, metadata=body.metadata,
            blobs=[actions.ChannelBlob(channel=b.channel, version=b.version, value=_blob(b.value),
                                       fingerprint=b.fingerprint) for b in body.blobs],
            open_spec=open_spec, values=body.values,
            writes=[actions.TaskWrites(checkpoint_id=t.checkpoint_id, task_id=t.task_id, task_path=t.task_path,
                                       writes=[_write(w) for w in t.writes])
                    for t in body.writes],
        )
        span.set(session_id=stored.thread.session_id, checkpoint_id=stored.graph.record_id,
                 outcome="created" if stored.created else "replayed")
    g = stored.graph
    return (201 if stored.created else 200, {
        "thread_id": stored.thread.thread_id, "checkpoint_ns": g.checkpoint_ns, "checkpoint_id": g.checkpoint_id,
        "session_id": stored.thread.session_id, "run_id": g.record.run_id, "record_id": g.record_id,
        "created": stored.created, "runtime_id": stored.runtime_id,
    })


@router.post(
    "/graph-threads/writes", response={200: GraphWritesOut, **errors(403, 404, 409, 413)},
    auth=RECALL,
    summary="Store a task's pending writes against a graph checkpoint id (a repeated (task, idx) is stored once)",
)
def put_writes(request: HttpRequest, body: GraphWritesIn):
    return writes_answer(caller(request), body)[1]


def writes_answer(who: Caller, body: GraphWritesIn) -> tuple[int, dict[str, Any]]:
    """The writes route's action and answer: this route's and the API socket's (``api/socket.py``)."""
    with tracing.span("graph_writes", writes=len(body.writes)) as span:
        stored = actions.put_writes(
            who, thread_id=body.thread_id, checkpoint_ns=body.checkpoint_ns,
            checkpoint_id=body.checkpoint_id, task_id=body.task_id, task_path=body.task_path,
            writes=[_write(w) for w in body.writes],
            open_spec=actions.ThreadSpec(**body.open.model_dump()) if body.open is not None else None,
        )
        span.set(stored=stored)
    return 200, {"stored": stored}


@router.post(
    "/graph-blobs", response={200: GraphBlobChunkOut, **errors(403, 404, 413)},
    summary="Upload a chunk of a state blob too large for one request (the last chunk stores the blob, "
    "checked against its fingerprint; a chunk of a stored blob is accepted and ignored)",
)
def upload_blob_chunk(request: HttpRequest, body: GraphBlobChunkIn):
    out = actions.upload_chunk(caller(request), fingerprint=body.fingerprint, serde=body.serde, index=body.index,
                               count=body.count, data=body.data)
    return {"fingerprint": out.fingerprint, "complete": out.complete, "received": out.received}


@router.post(
    "/graph-blobs/missing", response={200: GraphBlobsMissingOut, **errors(403, 404, 413)},
    summary="Which of these blob fingerprints the project does not hold (to upload before naming them)",
)
def missing_blobs(request: HttpRequest, body: GraphBlobsAskIn):
    return {"missing": actions.missing_blobs(caller(request), body.fingerprints)}


@router.get(
    "/graph-threads/checkpoints", response={200: GraphListOut, **errors(403)},
    summary="List graph checkpoints, newest first (filters: thread, namespace, id, before, metadata)",
)
def list_checkpoints(
    request: HttpRequest, thread_id: str | None = None, checkpoint_ns: str | None = None,
    checkpoint_id: str | None = None, before: str | None = None, metadata: str | None = None, limit: int = page_limit(),
):
    refuse_unstorable_text({"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id,
                            "before": before}, where="query")
    filter_: Any = None
    if metadata is not None:
        try:
            filter_ = loads_json(metadata)
        except (ValueError, RecursionError):
            raise ValidationFailed("metadata must be a JSON object", field="metadata") from None
        if not isinstance(filter_, dict):
            raise ValidationFailed("metadata must be a JSON object", field="metadata")
        refuse_unstorable_text({"metadata": filter_})  # NUL or a lone surrogate: PostgreSQL would refuse it
    who = caller(request)
    items = actions.list_checkpoints(
        who, thread_id=thread_id, checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id, before=before,
        metadata=filter_, limit=limit,
    )
    return {"items": _out(items, who.project_ids)}


@router.get("/graph-threads", response={200: GraphThreadOut, **errors(403, 404)}, summary="The session of a graph thread")
def get_thread(request: HttpRequest, thread_id: str = Query(..., min_length=1, max_length=actions.MAX_PATH_LENGTH)):
    who = caller(request)
    who.require("read")
    refuse_unstorable_text({"thread_id": thread_id}, where="query")
    thread = actions.find_thread(who, thread_id)
    if thread is None:
        raise NotFound("graph thread not found", thread_id=thread_id)
    return {"thread_id": thread.thread_id, "session_id": thread.session_id, "created_at": thread.created_at}


@router.delete(
    "/graph-threads", response={200: GraphDeleteOut, **errors(403, 409)},
    summary="Delete a graph thread: close its session's runtime and forget the session (no thread: deleted=false)",
)
def delete_thread(request: HttpRequest, thread_id: str = Query(..., min_length=1, max_length=actions.MAX_PATH_LENGTH)):
    refuse_unstorable_text({"thread_id": thread_id}, where="query")
    session_id = actions.delete_thread(caller(request), thread_id)
    return {"deleted": session_id is not None, "session_id": session_id}


@router.post(
    "/graph-threads/copy", response={201: GraphCopyOut, **errors(403, 404, 409)},
    summary="Copy a graph thread into a new one: a new session with the source's spec, whose history starts from the "
    "copy (checkpoints, channel versions and pending writes; blobs shared by fingerprint)",
)
def copy_thread(request: HttpRequest, body: GraphCopyIn):
    copied = actions.copy_thread(caller(request), body.source_thread_id, body.target_thread_id)
    return Status(201, {
        "thread_id": copied.thread.thread_id, "session_id": copied.thread.session_id, "run_id": copied.run_id,
        "runtime_id": copied.runtime_id, "source_thread_id": body.source_thread_id,
        "source_session_id": copied.source_session_id, "checkpoints": copied.checkpoints, "writes": copied.writes,
    })


def _removed(items: list[actions.Removed]) -> dict[str, Any]:
    return {"threads": [{"thread_id": r.thread_id, "session_id": r.session_id, "checkpoints": r.checkpoints,
                         "writes": r.writes, "channel_versions": r.channel_versions, "run_ids": list(r.run_ids)}
                        for r in items]}


@router.post(
    "/graph-threads/prune", response={200: GraphRemovedListOut, **errors(403)},
    summary="Prune graph threads (LangGraph's strategies; each thread's session records what went in a `graph.pruned` "
    "event)",
)
def prune(request: HttpRequest, body: GraphPruneIn):
    return _removed(actions.prune(caller(request), body.thread_ids, body.strategy))


@router.post(
    "/graph-threads/delete-for-runs", response={200: GraphRemovedListOut, **errors(403)},
    summary="Delete the graph checkpoints (and their pending writes) of LangGraph runs, in every thread the token "
    "reaches (each session records what went in a `graph.runs_deleted` event)",
)
def delete_for_runs(request: HttpRequest, body: GraphRunsDeleteIn):
    return _removed(actions.delete_for_runs(caller(request), body.run_ids))
