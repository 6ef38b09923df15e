"""API tokens: 256-bit random secrets, shown once, stored as SHA-256."""
from __future__ import annotations

import secrets

from novelforge_sessions.errors import ValidationFailed
from novelforge_sessions.models import ApiToken, Project, Session

TOKEN_PREFIX = "nfs_"
ALL_PERMISSIONS = [p.value for p in ApiToken.Permission]
#: The name is part of the caller label recorded with every event (``token:<name>#<id>``).
MAX_NAME = 100


def create_token(
    project: Project, *, name: str, permissions: list[str], session: Session | None = None
) -> tuple[ApiToken, str]:
    if not name.strip() or len(name) > MAX_NAME:
        raise ValidationFailed(f"a token name is 1–{MAX_NAME} characters", field="name")
    unknown = sorted(set(permissions) - set(ALL_PERMISSIONS))
    if unknown or not permissions:
        raise ValidationFailed("unknown or empty permissions", field="permissions", unknown=unknown, allowed=ALL_PERMISSIONS)
    if session is not None and session.project_id != project.id:
        raise ValidationFailed("a token can only be bound to a session of its own project", field="session")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        name=name, project=project, session=session, key_hash=ApiToken.hash_key(raw), key_prefix=raw[:12],
        permissions=sorted(set(permissions)),
    )
    return token, raw
