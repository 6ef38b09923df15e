"""Artifacts and their immutable versions."""
from __future__ import annotations

from django.http import HttpRequest
from ninja import Router, Status

from novelforge_sessions.actions import artifacts as actions
from novelforge_sessions.apikit.common import caller, errors, get_or_404, keyset
from novelforge_sessions.api.schemas import (
    ArtifactIn,
    ArtifactOut,
    ArtifactVersionContentOut,
    ArtifactVersionIn,
    ArtifactVersionOut,
)
from novelforge_sessions.apikit.schemas import Page, page_after, page_limit
from novelforge_sessions.models import Artifact, ArtifactVersion

router = Router(tags=["artifacts"])


def _out(artifact: Artifact) -> dict:
    return {
        "id": artifact.id, "name": artifact.name, "kind": artifact.kind,
        "current_version_id": artifact.current_version_id,
        "current_fingerprint": artifact.current_version.fingerprint if artifact.current_version else None,
        "created_at": artifact.created_at,
    }


@router.post("/artifacts", response={201: ArtifactOut, **errors(403, 409, 413)}, summary="Create an artifact with its first version")
def create_artifact(request: HttpRequest, body: ArtifactIn):
    return Status(201, _out(actions.create_artifact(caller(request), name=body.name, kind=body.kind, content=body.content)))


@router.get("/artifacts", response={200: Page[ArtifactOut], **errors(403)}, summary="List artifacts")
def list_artifacts(request: HttpRequest, after: int | None = page_after(), limit: int = page_limit()):
    who = caller(request)
    who.require("read")
    qs = who.scope("artifact", Artifact.objects.filter(project_id__in=who.project_ids))
    page = keyset(qs.select_related("current_version"), after=after, limit=limit)
    return {"items": [_out(a) for a in page["items"]], "next_after": page["next_after"]}


@router.get("/artifacts/{artifact_id}", response={200: ArtifactOut, **errors(403, 404)}, summary="Get an artifact")
def get_artifact(request: HttpRequest, artifact_id: int):
    who = caller(request)
    who.require("read")
    qs = who.scope("artifact", Artifact.objects.filter(project_id__in=who.project_ids), artifacts=[artifact_id]).select_related("current_version")
    return _out(get_or_404(qs, "artifact", id=artifact_id))


@router.post(
    "/artifacts/{artifact_id}/versions", response={201: ArtifactVersionOut, **errors(403, 404, 413)},
    summary="Add an immutable version (the server computes its sha256 fingerprint; it does not become current)",
)
def add_version(request: HttpRequest, artifact_id: int, body: ArtifactVersionIn):
    return Status(201, actions.add_artifact_version(caller(request), artifact_id, content=body.content))


@router.get(
    "/artifact-versions/{version_id}", response={200: ArtifactVersionContentOut, **errors(403, 404)},
    summary="Get one version with its content",
)
def get_version(request: HttpRequest, version_id: int):
    who = caller(request)
    who.require("read")
    qs = who.scope("artifact_version", ArtifactVersion.objects.filter(artifact__project_id__in=who.project_ids),
                   versions=[version_id])
    return get_or_404(qs, "artifact version", id=version_id)
