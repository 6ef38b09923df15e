"""A real server process for end-to-end tests (websockets, browsers, other processes).

pytest-django's ``live_server`` is WSGI only, so this starts ``daphne`` (as ``make run``
serves) or, with ``server="uvicorn"``, the production server ``python -m
novelforge_sessions.serve`` (as ``make serve-cluster`` serves) through the project's one launcher
(``harness/servers.py``), on a free port, pointed at the *test* database. Tests that use it must be
``django_db(transaction=True)`` so their rows are committed and visible to the server.
"""
from __future__ import annotations

from django.conf import settings

from harness.servers import ROOT, Server, free_port, server_env

__all__ = ["ROOT", "DaphneServer", "database_url", "free_port"]

ARTIFACTS = ROOT / "tests" / "artifacts"


def database_url() -> str:
    """The test database's URL, for processes the tests start."""
    db = settings.DATABASES["default"]
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


class DaphneServer(Server):
    """The project served on the test database; its log is ``tests/artifacts/<server>-<port>.log``
    (fresh for each server). ``port``: a restart on the same address."""

    def __init__(self, *, redis_url: str | None = None, extra_env: dict[str, str] | None = None,
                 port: int | None = None, server: str = "daphne") -> None:
        env = server_env(
            DATABASE_URL=database_url(), DJANGO_SETTINGS_MODULE="novelforge_sessions.settings",
            SECRET_KEY=settings.SECRET_KEY,
        )
        # Serve like `make run` does: connections come from psycopg's pool.
        env.setdefault("DB_POOL_MAX_SIZE", "8")
        if redis_url:
            env["REDIS_URL"] = redis_url
        env.update(extra_env or {})
        super().__init__(env, lambda p: ARTIFACTS / f"{server}-{p}.log", kind=server, port=port, fresh_log=True)

    @property
    def server(self) -> str:
        return self.kind
