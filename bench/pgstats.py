"""Server-side counters for one benchmark database.

Everything here is read over a separate connection to the maintenance database ``postgres``,
so the reads never count against the database being measured.

Why "quiesce" first: since PostgreSQL 15 a backend keeps its transaction counts in local memory
and flushes them to ``pg_stat_database`` at most once a second while busy, or after 10 s of
idleness, or when it exits. A snapshot taken while the measured system still holds open
connections can therefore miss work it already did. The workloads close every connection they
opened and wait here until the database has no backends left: by then every count has been
flushed (the stats hook runs before a backend leaves ``pg_stat_activity``). DBOS keeps
background connections open for as long as it is launched; see ``workloads.run_dbos`` for how
its window is handled.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import make_conninfo

XID_MODULUS = 2**32


@dataclass(frozen=True)
class Snapshot:
    at: float  # time.perf_counter() when read
    xacts: int  # xact_commit + xact_rollback for the database
    rows_written: int  # tup_inserted + tup_updated + tup_deleted
    next_xid: int  # 32-bit xid that the next write transaction (cluster-wide) will get, roughly


class Counters:
    """Reads ``pg_stat_database`` for ``dbname`` through the ``postgres`` maintenance database."""

    def __init__(self, server_url: str, dbname: str) -> None:
        self.admin_conninfo = make_conninfo(server_url, dbname="postgres")
        self.db_conninfo = make_conninfo(server_url, dbname=dbname)
        self.dbname = dbname

    def backends(self) -> int:
        with psycopg.connect(self.admin_conninfo, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.dbname,),
            ).fetchone()
        return int(row[0])

    def quiesce(self, timeout: float = 30.0) -> bool:
        """Wait (polling, with a deadline) until no backend is connected to the database."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.backends() == 0:
                return True
            time.sleep(0.05)
        return False

    def snapshot(self) -> Snapshot:
        with psycopg.connect(self.admin_conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted "
                "FROM pg_stat_database WHERE datname = %s",
                (self.dbname,),
            ).fetchone()
            # Assigns one xid to this read itself (in another database); every transaction that
            # writes after this point gets a larger one.
            xid = conn.execute("SELECT txid_current()").fetchone()[0]
        return Snapshot(at=time.perf_counter(), xacts=int(row[0]), rows_written=int(row[1]), next_xid=int(xid) % XID_MODULUS)

    def settled_snapshot(self, timeout: float = 5.0) -> Snapshot:
        """Two equal reads 0.3 s apart (PostgreSQL <= 14 delivers counts through an async collector)."""
        deadline = time.monotonic() + timeout
        last = self.snapshot()
        while time.monotonic() < deadline:
            time.sleep(0.3)
            current = self.snapshot()
            if (current.xacts, current.rows_written) == (last.xacts, last.rows_written):
                return current
            last = current
        return last

    def writer_xids_since(self, start: Snapshot) -> int:
        """Distinct transaction ids among the live row versions written after ``start``.

        Every transaction that writes gets an xid, stamped as ``xmin`` on the row versions it
        creates. Counting distinct ``xmin`` values newer than ``start`` over every table counts
        the write transactions whose rows are still visible: exact for insert-only work, a lower
        bound when a later transaction rewrote the same row (only the last version survives).
        """
        if start.next_xid > XID_MODULUS - 10_000_000:
            return -1  # too close to wrap-around to compare 32-bit xids naively; report unknown
        xids: set[int] = set()
        with psycopg.connect(self.db_conninfo, autocommit=True) as conn:
            tables = conn.execute(
                "SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables"
            ).fetchall()
            for (table,) in tables:
                rows = conn.execute(
                    f"SELECT DISTINCT xmin::text::bigint FROM {table} WHERE xmin::text::bigint > %s",  # noqa: S608 - names from the catalog
                    (start.next_xid,),
                ).fetchall()
                xids.update(int(r[0]) for r in rows)
        return len(xids)
