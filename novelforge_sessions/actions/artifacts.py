"""Artifacts and their immutable, content-addressed versions.

Adding a version never changes what is current: making a version current is a consequential
write (a write intent, docs/model.md#write-intents-and-authority). The first version of a new artifact is current.
"""
from __future__ import annotations

from collections.abc import Iterable

from django.db import IntegrityError, transaction

from novelforge_sessions import event_types as ev
from novelforge_sessions import events
from novelforge_sessions.access import Caller
from novelforge_sessions.errors import ArtifactExists, NotFound, UnknownArtifactVersion, ValidationFailed
from novelforge_sessions.models import GRAPH_BLOB_KIND, Artifact, ArtifactVersion, content_fingerprint

MAX_ARTIFACT_BYTES = 1024 * 1024
MAX_NAME_LENGTH = 200


def require_versions(
    reach: Caller | None, project_id: int, refs: Iterable[tuple[int, str]], *, what: str,
) -> dict[tuple[int, str], int | None]:
    """Refuse (422 ``unknown_artifact_version``) unless every (artifact id, fingerprint) names
    an existing version of an artifact of this project within ``reach``'s reach
    (``Caller.scope("artifact_version")``, naming the cited artifacts: index probes per
    artifact, flat in the session's checkpoints). Returns each pair's artifact head (its current
    version id) as of now. One statement, the reach a subquery in it.

    Citing a version gives its artifact to the citing session (``access.artifacts_given_to``),
    so a citation may only name what the caller can already read: a version outside a
    session-bound token's reach is refused exactly as a missing one (same code, message and
    details: ids are not an oracle), and an unbound token, which reaches the whole project, is
    how an orchestrator gives a session an artifact. ``reach`` None: the calling action has
    resolved the refs within its caller's reach itself (a review gate's candidate, a graph
    thread's own state blobs).
    """
    wanted = set(refs)
    if not wanted:
        return {}
    versions = ArtifactVersion.objects.filter(
        artifact__project_id=project_id,
        artifact_id__in={a for a, _ in wanted},
        fingerprint__in={f for _, f in wanted},
    )
    if reach is not None:
        versions = reach.scope("artifact_version", versions, artifacts={a for a, _ in wanted})
    found = {(a, f): head for a, f, head in versions.values_list("artifact_id", "fingerprint", "artifact__current_version_id")}
    missing = sorted(wanted - set(found))
    if missing:
        raise UnknownArtifactVersion(
            f"{what} must name existing versions of this project's artifacts",
            missing=[{"artifact_id": a, "fingerprint": f} for a, f in missing],
        )
    return found


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
