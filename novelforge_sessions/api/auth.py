"""Bearer-token authentication for agents (django-ninja security class).

The token is hashed and looked up in one indexed read; ``last_used_at`` is refreshed at most
once per ``TOKEN_LAST_USED_RESOLUTION_SECONDS`` by a conditional UPDATE, so a busy agent's
requests stay read-only on the auth path (DESIGN §12). Tokens never appear in logs.
"""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from novelforge_sessions.access import Caller
from novelforge_sessions.models import ApiToken


def caller_for_token(raw: str) -> Caller | None:
    if not raw or len(raw) > 200:
        return None
    try:
        token = ApiToken.objects.select_related("project").get(key_hash=ApiToken.hash_key(raw), revoked_at__isnull=True)
    except ApiToken.DoesNotExist:
        return None
    now = timezone.now()
    stale_before = now - timedelta(seconds=settings.TOKEN_LAST_USED_RESOLUTION_SECONDS)
    if token.last_used_at is None or token.last_used_at < stale_before:
        ApiToken.objects.filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale_before), id=token.id).update(
            last_used_at=now
        )
    return Caller(
        label=f"token:{token.name[:100]}#{token.id}",  # fits every actor column, whatever the admin allowed
        project_ids=frozenset({token.project_id}),
        permissions=frozenset(token.permissions),
        session_id=token.session_id,
        token_id=token.id,
        project=token.project,
    )


class TokenAuth(HttpBearer):
    openapi_description = "An API token (`nfs_…`) from `manage.py create_api_token` or the admin."

    def authenticate(self, request: HttpRequest, token: str) -> Caller | None:
        return caller_for_token(token)
