"""Artifacts and their immutable, content-addressed versions.

Adding a version never changes what is current: making a version current is a consequential
write (a write intent, docs/model.md#write-intents-and-authority). The first version of a new artifact is current.
"""
from __future__ import annotations

from collections.abc import Iterable

from django.db import IntegrityError, connection, transaction

from novelforge_sessions import event_types as ev
from novelforge_sessions import events
from novelforge_sessions.access import Caller
from novelforge_sessions.errors import ArtifactExists, NotFound, UnknownArtifactVersion, ValidationFailed
from novelforge_sessions.models import GRAPH_BLOB_KIND, Artifact, ArtifactVersion, content_fingerprint

MAX_ARTIFACT_BYTES = 1024 * 1024
MAX_NAME_LENGTH = 200


#: The graph blobs among ``%(blobs)s`` (artifact ids), locked ``FOR KEY SHARE`` until the
#: citing transaction commits. Garbage collection (``control/graph_gc.py``) locks a blob ``FOR
#: UPDATE SKIP LOCKED`` before it checks that nothing cites it, so a held blob is skipped, and a
#: blob it locked first is waited for and then found gone (not returned). Only the graph's own
#: blobs are locked: no pass ever removes any other artifact, which stays as cheap to cite as it was.
HOLD_BLOBS_SQL = (f"SELECT a.id FROM {Artifact._meta.db_table} a WHERE a.id = ANY(%(blobs)s::bigint[])"
                  f" AND a.kind = '{GRAPH_BLOB_KIND}' FOR KEY SHARE")


class Heads(dict[tuple[int, str], "int | None"]):
    """Each cited (artifact id, fingerprint)'s artifact head (its current version id), and
    ``blobs``: the cited artifacts that are graph state blobs, which garbage collection removes
    once nothing cites them (a citation holds them: :data:`HOLD_BLOBS_SQL`)."""

    def __init__(self, found: dict[tuple[int, str], int | None], blobs: Iterable[int]) -> None:
        super().__init__(found)
        self.blobs: list[int] = sorted(set(blobs))


def require_versions(
    reach: Caller | None, project_id: int, refs: Iterable[tuple[int, str]], *, what: str, hold: bool = True,
) -> Heads:
    """Refuse (422 ``unknown_artifact_version``) unless every (artifact id, fingerprint) names
    an existing version of an artifact of this project within ``reach``'s reach
    (``Caller.scope("artifact_version")``, naming the cited artifacts: index probes per
    artifact, flat in the session's checkpoints). Returns each pair's artifact head (its current
    version id) as of now, and which cited artifacts are graph blobs. One statement, the reach a
    subquery in it.

    Citing a version gives its artifact to the citing session (``access.artifacts_given_to``),
    so a citation may only name what the caller can already read: a version outside a
    session-bound token's reach is refused exactly as a missing one (same code, message and
    details: ids are not an oracle), and an unbound token, which reaches the whole project, is
    how an orchestrator gives a session an artifact. ``reach`` None: the calling action has
    resolved the refs within its caller's reach itself (a review gate's candidate, a graph
    thread's own state blobs).

    ``hold``: the citation is written in the caller's transaction (it must be in one), which
    this then holds the cited graph blobs for (:func:`hold_blobs`; a second statement, only when
    a graph blob is cited). ``hold=False``: the caller's own write statement holds them
    (``%(blobs)s`` in its text, ``Heads.blobs``), or nothing keeps the citation (a settlement's
    params are not one garbage collection reads).
    """
    wanted = set(refs)
    if not wanted:
        return Heads({}, ())
    versions = ArtifactVersion.objects.filter(
        artifact__project_id=project_id,
        artifact_id__in={a for a, _ in wanted},
        fingerprint__in={f for _, f in wanted},
    )
    if reach is not None:
        versions = reach.scope("artifact_version", versions, artifacts={a for a, _ in wanted})
    found, blobs = {}, set()
    for a, f, head, kind in versions.values_list("artifact_id", "fingerprint", "artifact__current_version_id",
                                                 "artifact__kind"):
        found[(a, f)] = head
        if kind == GRAPH_BLOB_KIND:
            blobs.add(a)
    missing = sorted(wanted - set(found))
    if missing:
        raise unknown_versions(what, missing)
    heads = Heads(found, blobs)
    if hold and heads.blobs:
        gone = set(heads.blobs) - hold_blobs(heads.blobs)
        if gone:
            raise unknown_versions(what, sorted(pair for pair in wanted if pair[0] in gone))
    return heads


def hold_blobs(blobs: list[int]) -> set[int]:
    """Lock the graph blobs ``blobs`` for the rest of the caller's transaction
    (:data:`HOLD_BLOBS_SQL`); the ones still there. A citation written in this transaction
    then keeps them: a blob garbage collection removed since it was read is missing."""
    if transaction.get_autocommit():
        raise RuntimeError("hold_blobs outside a transaction holds nothing")
    with connection.cursor() as db:
        db.execute(HOLD_BLOBS_SQL, {"blobs": blobs})
        return {row[0] for row in db.fetchall()}


def gone_blobs(blobs: list[int]) -> set[int]:
    """Of the graph blobs ``blobs``, those that no longer exist (after a write statement that
    holds its blobs wrote nothing because one was gone)."""
    return set(blobs) - set(Artifact.objects.filter(id__in=blobs).values_list("id", flat=True))


def unknown_versions(what: str, missing: list[tuple[int, str]]) -> UnknownArtifactVersion:
    """The refusal of refs naming no version (``missing``: (artifact id, fingerprint) pairs, sorted)."""
    return UnknownArtifactVersion(
        f"{what} must name existing versions of this project's artifacts",
        missing=[{"artifact_id": a, "fingerprint": f} for a, f in missing],
    )


def _check_content(content: str) -> bytes:
    data = content.encode()
    if len(data) > MAX_ARTIFACT_BYTES:
        raise ValidationFailed(f"content is {len(data)} bytes; at most {MAX_ARTIFACT_BYTES}", field="content")
    return data


def create_artifact(caller: Caller, *, name: str, kind: str, content: str) -> Artifact:
    caller.require("write")
    if len(name) > MAX_NAME_LENGTH:
        raise ValidationFailed(f"name is {len(name)} characters; at most {MAX_NAME_LENGTH}", field="name",
                               limit=MAX_NAME_LENGTH)
    if not name.strip():
        raise ValidationFailed("name must not be blank (empty or only whitespace)", field="name")
    if kind == GRAPH_BLOB_KIND:
        # Reserved for the graph's state blobs, which garbage collection removes once unreferenced:
        # an artifact made here is never one of them.
        raise ValidationFailed(f"the kind {GRAPH_BLOB_KIND!r} is reserved for graph state blobs", field="kind")
    data = _check_content(content)
    project = caller.single_project()
    try:
        with transaction.atomic():
            artifact = Artifact.objects.create(project=project, name=name, kind=kind or "document")
            version = ArtifactVersion.objects.create(
                artifact=artifact, number=1, content=content, fingerprint=content_fingerprint(data), created_by=caller.label
            )
            artifact.current_version = version
            artifact.save(update_fields=["current_version"])
            events.append(
                project_id=project.id, type=ev.ARTIFACT_CREATED, actor=caller.label,
                payload={"artifact_id": artifact.id, "name": name, "version": 1, "fingerprint": version.fingerprint},
            )
    except IntegrityError:
        raise ArtifactExists("an artifact with this name exists in the project", name=name) from None
    return artifact


def add_artifact_version(caller: Caller, artifact_id: int, *, content: str) -> ArtifactVersion:
    caller.require("write")
    data = _check_content(content)
    with transaction.atomic():
        try:
            artifact = caller.scope("artifact", Artifact.objects.select_for_update(), artifacts=[artifact_id]).get(
                id=artifact_id, project_id__in=caller.project_ids
            )
        except Artifact.DoesNotExist:
            raise NotFound("artifact not found", artifact_id=artifact_id) from None
        if artifact.kind == GRAPH_BLOB_KIND:
            raise ValidationFailed("a graph state blob has one immutable version", field="artifact_id")
        last = artifact.versions.order_by("-number").values_list("number", flat=True).first() or 0
        version = ArtifactVersion.objects.create(
            artifact=artifact, number=last + 1, content=content, fingerprint=content_fingerprint(data), created_by=caller.label
        )
        events.append(
            project_id=artifact.project_id, type=ev.ARTIFACT_VERSION_ADDED, actor=caller.label,
            payload={"artifact_id": artifact.id, "version": version.number, "fingerprint": version.fingerprint},
        )
    return version
