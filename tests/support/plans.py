"""Plan walking for the "flat in the table's size" tests: a statement is run again under
``EXPLAIN (ANALYZE, FORMAT JSON)`` and the executor's own row counts are read per table, so
"reads only what it shows" is testable without a clock."""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import connection


def walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from walk(child)


def analysed_plan(sql: str, params: Any) -> dict[str, Any]:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        raw = cur.fetchone()[0]
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


def rows_touched(plan: dict[str, Any], tables: Iterable[str]) -> tuple[Counter, set[str]]:
    """Per table of ``tables``: the rows its scans returned times their loops, plus those an index
    condition's recheck or a filter discarded; and the tables scanned sequentially."""
    tables = set(tables)
    touched: Counter = Counter()
    seq: set[str] = set()
    for node in walk(plan):
        table = node.get("Relation Name")
        if table not in tables:
            continue
        if node["Node Type"] == "Seq Scan":
            seq.add(table)
        touched[table] += node.get("Actual Loops", 1) * (
            node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0))
    return touched, seq


class Reads:
    """Records every SELECT this connection sends that names one of ``tables``."""

    def __init__(self, tables: Iterable[str]) -> None:
        self.tables = tuple(tables)
        self.statements: list[tuple[str, Any]] = []

    def __call__(self, execute, sql, params, many, context):
        if not many and sql.lstrip().upper().startswith("SELECT") and any(t in sql for t in self.tables):
            self.statements.append((sql, params))
        return execute(sql, params, many, context)
