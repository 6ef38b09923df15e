"""Real server processes for end-to-end tests: ``DaphneServer`` and its helpers live in the test kit
(``tests/support/servers.py``, on the project's one launcher ``harness/servers.py``); they are
re-exported here for the live tests and their fixtures."""
from __future__ import annotations

from tests.support.servers import ROOT, DaphneServer, database_url, free_port

__all__ = ["ROOT", "DaphneServer", "database_url", "free_port"]
