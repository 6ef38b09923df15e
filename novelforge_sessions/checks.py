"""System checks of our own settings (run by ``manage.py check``; ``--deploy`` for the deploy ones)."""
from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security, deploy=True)
def development_secret_key(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The development SECRET_KEY is public (it is in the source): never in production."""
    if getattr(settings, "SECRET_KEY_IS_DEVELOPMENT_DEFAULT", False):
        return [
            checks.Warning(
                "SECRET_KEY is the development default, which is published in the source.",
                hint="Set SECRET_KEY to a long random value (and REQUIRE_SECRET_KEY=true).",
                id="novelforge_sessions.W001",
            )
        ]
    return []
