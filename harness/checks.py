"""Client histories against the database: duplicates and lost acknowledged effects."""
from __future__ import annotations

from typing import Any

import psycopg

from harness.agents import History


def effects(db_url: str, tables: dict[str, str], project_id: int) -> dict[str, dict[str, int]]:
    """Per logical id: handoffs, receipts, consumed deliveries, and the two events' counts."""
    h, r, d, e = tables["Handoff"], tables["ConsumeReceipt"], tables["ResultDelivery"], tables["Event"]
    out: dict[str, dict[str, int]] = {}
    with psycopg.connect(db_url, autocommit=True) as conn:
        def each(sql: str, field: str) -> None:
            for logical_id, n in conn.execute(sql, [project_id]).fetchall():
                out.setdefault(logical_id, {})[field] = n

        each(f"SELECT logical_id, count(*) FROM {h} WHERE project_id = %s GROUP BY 1", "handoffs")
        each(f"SELECT logical_id, count(*) FROM {r} WHERE project_id = %s GROUP BY 1", "receipts")
        each(f"SELECT h.logical_id, count(*) FROM {d} d JOIN {h} h ON h.id = d.handoff_id "
             f"WHERE h.project_id = %s AND d.outcome = 'consumed' GROUP BY 1", "consumed_deliveries")
        each(f"SELECT payload->>'logical_id', count(*) FROM {e} WHERE project_id = %s "
             f"AND type = 'handoff.created' GROUP BY 1", "created_events")
        each(f"SELECT payload->>'logical_id', count(*) FROM {e} WHERE project_id = %s "
             f"AND type = 'handoff.result_consumed' GROUP BY 1", "consumed_events")
    return out


def verdict(history: History, db: dict[str, dict[str, int]]) -> dict[str, Any]:
    """0 duplicates: no logical id has more than one of any effect. 0 lost: every acknowledged
    handoff exists once, every acknowledged delivery was consumed once."""
    acked_created = history.acked("create_handoff")
    acked_delivered = history.acked("deliver")
    duplicates = sorted(k for k, row in db.items() if any(n > 1 for n in row.values()))
    lost = sorted(
        {k for k in acked_created if db.get(k, {}).get("handoffs", 0) != 1 or db.get(k, {}).get("created_events", 0) != 1}
        | {k for k in acked_delivered if db.get(k, {}).get("receipts", 0) != 1 or db.get(k, {}).get("consumed_events", 0) != 1}
    )
    return {
        "acknowledged": len(acked_created) + len(acked_delivered),
        "duplicates": len(duplicates), "lost": len(lost),
        "duplicate_ids": duplicates[:10], "lost_ids": lost[:10],
        "history": history.counts(),
    }
