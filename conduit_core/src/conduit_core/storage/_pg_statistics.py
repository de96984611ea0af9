"""The query planner's statistics for a young store: ANALYZE of the tables that outgrew them.

PostgreSQL's autovacuum analyzes a table at most once per ``autovacuum_naptime`` (a minute by
default). A store that fills from empty at hundreds of jobs a second is planned without any
statistics until then: the planner takes every ``work_id = ?`` for 0.5 % of the table and a
never-analyzed table for ten pages, and picks whole-table scans and hash joins where an index
reaches one row (a claim's read of its Work's inputs took 2-5 ms instead of 0.05, and every
prepared plan made while the tables were small stays until the next ANALYZE invalidates it).
``refresh`` ANALYZEs each conduit table whose live rows are more than twice what its statistics
describe, and at least :data:`MIN_ROWS`: a few times while a store grows (the count doubles
between two), never in a steady state, which stays autovacuum's. ANALYZE reads a sample, takes
no lock that blocks reads or writes, and invalidates the plans made without it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

__all__ = ["MIN_ROWS", "refresh"]

#: Below this many live rows a whole-table scan costs less than it is worth analyzing for.
MIN_ROWS = 1000

_OUTGROWN = """
SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = current_schema() AND s.relname LIKE 'conduit\\_%%'
  AND s.n_live_tup >= %s AND s.n_live_tup > 2 * GREATEST(c.reltuples, 0)
ORDER BY s.relname
"""


def refresh(conn: psycopg.Connection[Any]) -> list[str]:
    """ANALYZE the conduit tables of ``conn``'s schema that outgrew their statistics (on an
    autocommit connection, each table on its own); returns their names."""
    # Never prepared by psycopg: once it has prepared a statement of its own on a connection,
    # its rollbacks end with DEALLOCATE ALL, which drops the store's own (``_pipeline``).
    found = conn.execute(_OUTGROWN, (MIN_ROWS,), prepare=False).fetchall()
    names = [row[0] for row in found]
    for name in names:
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(name)), prepare=False)
    return names
