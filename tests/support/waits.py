"""The one polling wait of the suite: ``wait_until(predicate, what, timeout=…)`` returns the
predicate's first truthy value or fails naming ``what``. The launcher's module holds it so the
harness and the bench poll the same way (``harness/servers.py``)."""
from __future__ import annotations

from harness.servers import wait_until

__all__ = ["wait_until"]
