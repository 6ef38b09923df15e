"""The suite's test kit: one copy of each helper the tests share.

- ``responses``: ``ok`` (the status, then the body) and ``refused`` (the status, the typed error
  code and its details, and — given a snapshot — that nothing was written).
- ``snapshots``: ``snapshot()``, every row of the project's own tables, to compare before/after.
- ``races``: ``race()``, threads released together against PostgreSQL; every outcome is returned.
- ``waits``: ``wait_until()``, the one polling wait (no test sleeps to synchronise).
- ``servers``: ``DaphneServer``, a real server process on the test database (the launcher itself
  is ``harness/servers.py``, shared with the bench and the harness).
- ``factories``: projects, callers, the API client, sessions with a run.
- ``lifecycle``: the session lifecycle table, written out by hand, that the tests check the
  code's table against.

This package imports nothing itself, so a submodule that needs no Django (``waits``) can be
used by processes the tests start.
"""
