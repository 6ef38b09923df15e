"""Standard Webhooks signatures (docs/webhooks.md#verifying-a-delivery).

A secret is ``whsec_`` + base64 of 32 random bytes. A delivery carries ``webhook-id``,
``webhook-timestamp`` (Unix seconds) and ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">``, one per secret in force, separated by spaces (after a rotation
the previous secret signs too, until its overlap ends). The signature is computed by the
``standardwebhooks`` package, the specification's reference implementation.
"""
from __future__ import annotations

import base64
import secrets
from datetime import datetime

from standardwebhooks import Webhook

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def headers(*, webhook_id: str, timestamp: datetime, body: bytes, secrets_in_force: list[str]) -> dict[str, str]:
    """The three Standard Webhooks headers for one attempt (a signature per secret)."""
    signatures = " ".join(Webhook(secret).sign(webhook_id, timestamp, body) for secret in secrets_in_force if secret)
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": signatures,
    }
