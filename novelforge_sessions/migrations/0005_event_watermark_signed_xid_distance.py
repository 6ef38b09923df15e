"""The event watermark never goes negative, so it never goes backwards.

0004's ``nf_event_watermark`` widened each running backend's 32-bit ``backend_xid`` against
the snapshot's xmax with an unsigned distance. The xmax is the latest *completed* xid plus
one, so a transaction that holds an xid at or above it is routine: two write transactions
open at once are enough. That xid's distance then wrapped to nearly 2^32, and the watermark
came out hugely negative, hiding every event. A negative watermark is not merely
conservative. A reader that took "the highest visible id" at one moment (a high watermark)
and read a page at the next (a negative one) got an empty page. It then moved its cursor
past events it never sent: the live stream's catch-up had exactly this gap. "The highest visible id"
also came out as 0, so a new subscriber that asked for "from now on" got the whole log.

Here the distance is signed (xids in use are within 2^31 of each other; PostgreSQL's
wraparound protection guarantees it). An xid at or above xmax widens to itself, above xmax,
so it never lowers the watermark below xmax. The watermark is then monotone: an xid below
an earlier watermark was assigned before that watermark was taken and had finished by
then, so it can never be running later.
"""
from django.db import migrations

EVENT_ID_BITS = 16

FORWARD = f"""
-- The smallest event id a transaction still running in this database (not this backend) may
-- hold, or that a transaction starting later may get. The statement's snapshot (its xmax) is
-- taken before pg_stat_activity is read (re-read: pg_stat_clear_snapshot), so a transaction
-- that starts in between has an xid >= xmax. backend_xid is 32-bit: widened against xmax by
-- the signed distance between them (an xid at or above xmax stays above it).
CREATE OR REPLACE FUNCTION nf_event_watermark() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  nxt bigint;
  low bigint;
BEGIN
  PERFORM pg_stat_clear_snapshot();
  SELECT s.nxt,
         min(s.nxt - ((((s.nxt % 4294967296) - a.backend_xid::text::bigint) + 6442450944) % 4294967296
                      - 2147483648))
    INTO nxt, low
    FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS nxt) AS s
    LEFT JOIN pg_stat_activity AS a
      ON a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.backend_xid IS NOT NULL
   GROUP BY s.nxt;
  RETURN least(nxt, coalesce(low, nxt)) << {EVENT_ID_BITS};
END $$;
"""

# 0004's function, restored on the way back.
BACKWARD = f"""
CREATE OR REPLACE FUNCTION nf_event_watermark() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  nxt bigint;
  low bigint;
BEGIN
  PERFORM pg_stat_clear_snapshot();
  SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
         min(pg_snapshot_xmax(pg_current_snapshot())::text::bigint
             - ((((pg_snapshot_xmax(pg_current_snapshot())::text::bigint % 4294967296)
                  - a.backend_xid::text::bigint) % 4294967296 + 4294967296) % 4294967296))
    INTO nxt, low
    FROM (SELECT 1) AS one
    LEFT JOIN pg_stat_activity AS a
      ON a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.backend_xid IS NOT NULL;
  RETURN least(nxt, coalesce(low, nxt)) << {EVENT_ID_BITS};
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("novelforge_sessions", "0004_event_ids_commit_ordered")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
