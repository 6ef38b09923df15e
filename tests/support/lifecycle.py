"""The session lifecycle, written out by hand from the table docs/lifecycles.md shows,
independently of the code: ``tests/sessions/test_lifecycle_table.py`` checks every (from, to) pair
of ``novelforge_sessions.lifecycles.SESSION`` against it, and the model-based test
(``tests/harness/test_model.py``) predicts the API's answers from it."""
from __future__ import annotations

#: status → the statuses it may move to
SESSION_TRANSITIONS: dict[str, set[str]] = {
    "created": {"running"},
    "running": {"idle", "awaiting_user", "awaiting_external", "completed", "failed", "terminated", "stale"},
    "idle": {"running", "completed", "terminated", "stale"},
    "awaiting_user": {"running", "failed", "terminated", "stale"},
    "awaiting_external": {"running", "failed", "terminated", "stale"},
    "failed": {"running", "terminated", "stale"},
    "completed": {"stale"},
    "stale": {"terminated"},
    "terminated": set(),
}
