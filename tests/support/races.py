"""``race()``: the same work in several threads released together, against real PostgreSQL.

Each thread has its own database connection (closed when it is done); a barrier releases them at
once, so the database's locks and constraints decide, not the order the threads were started in.
Every outcome is returned, in thread order, as ``("ok", value)``, ``("error", code)`` for a typed
refusal (``ServiceError``), or ``("crash", repr)`` for anything else — which is a bug the test
must show: ``oks()`` asserts there is none. Tests then assert exact counts of each outcome.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from django.db import connection

from novelforge_sessions.errors import ServiceError

THREADS = 12
#: How long the threads together may take before the race fails (a deadlock, a lost wake-up).
TIMEOUT = 60.0


def race(work: Callable[[int], Any] | Sequence[Callable[[], Any]], n: int = THREADS, *,
         timeout: float = TIMEOUT) -> list[tuple[str, Any]]:
    """Run ``work(i)`` in ``n`` threads, or each callable of a list in its own thread; return the outcomes."""
    if callable(work):
        fns = [lambda i=i: work(i) for i in range(n)]
    else:
        fns = list(work)
    barrier = threading.Barrier(len(fns))
    results: list[tuple[str, Any]] = [("crash", "never ran")] * len(fns)

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = ("ok", fns[i]())
        except ServiceError as exc:
            results[i] = ("error", exc.code)
        except Exception as exc:  # anything else is a bug the test must show
            results[i] = ("crash", repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a racing thread never finished"
    return results


def oks(results: list[tuple[str, Any]]) -> list[Any]:
    """The values of a race in which every thread succeeded (fails otherwise, showing all outcomes)."""
    assert [kind for kind, _ in results] == ["ok"] * len(results), results
    return [value for _, value in results]
