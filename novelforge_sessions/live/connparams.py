"""Connection parameters for the live stream's own async psycopg connections (the feed's
reader in ``live/fanout.py``, the NOTIFY listener in ``live/pgnotify.py``): Django's, for the
default database, without Django's cursor class and adapters."""
from __future__ import annotations

from typing import Any

from django.db import connections


def plain_conninfo(application_name: str) -> dict[str, Any]:
    """Sync. psycopg's own adapters load jsonb as Python values and timestamptz as aware
    datetimes; Django's prepare_threshold (None: no server-side prepared statements, for
    connection poolers) is kept."""
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context"):
        params.pop(key, None)
    params["application_name"] = application_name
    # A peer that vanishes without a FIN (network loss) is noticed within about a minute.
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 30)
    params.setdefault("keepalives_interval", 10)
    params.setdefault("keepalives_count", 3)
    return params
