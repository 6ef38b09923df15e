"""The caller's project."""
from __future__ import annotations

from django.http import HttpRequest
from ninja import Router

from novelforge_sessions.apikit.common import caller, errors
from novelforge_sessions.api.schemas import ProjectOut

router = Router(tags=["projects"])


@router.get("/project", response={200: ProjectOut, **errors(403)}, summary="The token's project and its current authority")
def current_project(request: HttpRequest):
    who = caller(request)
    who.require("read")
    return who.single_project()
