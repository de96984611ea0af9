"""Work search: one query model for the API, the CLI and the console, read with keyset pages.

Pages are ordered by (created_at_ms, id), newest or oldest first, and continue after the last
row of the previous page (never OFFSET), so page 1000 reads as few rows as page 1. Each filter
but the input key has an index ending in (created_at_ms, id) (migration ``_V8``): status,
scope and binding each give one index range; an id prefix is a primary-key range. The input key
(``input.KEY=VALUE``, a top-level scalar of the Work's first input, kept in ``first_input``) has
no index: the database checks it (SQLite ``json_extract``, PostgreSQL ``->>``) on the rows the
other filters' index yields, in page order, so it is fast when matches are common and, on a rare
value, bounded by ``scan_limit`` rows (the page then ends early with a cursor to continue from).
"""

from __future__ import annotations

import msgspec

from conduit_core.model import Work
from conduit_core.storage._sql import Codec, Cx

__all__ = ["WorkQuery", "search_work"]


class WorkQuery(msgspec.Struct, frozen=True, kw_only=True):
    """Which Work, in which order (each field ``None``: no filter)."""

    id: str | None = None
    id_prefix: str | None = None
    binding: str | None = None
    #: A status, or ``exhausted`` (ready Work blocked until a person's retry).
    status: str | None = None
    scope: str | None = None
    #: Created at or after (ms since the epoch).
    since_ms: int | None = None
    #: Created before (ms since the epoch).
    until_ms: int | None = None
    #: ``input.KEY=VALUE``: the first input's top-level ``KEY`` equals ``VALUE`` (as text).
    input_key: str | None = None
    input_value: str | None = None
    newest_first: bool = True


def _prefix_end(prefix: str) -> str:
    """The least string greater than every string starting with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def search_work(
    cx: Cx, query: WorkQuery, limit: int, after: tuple[int, str] | None, scan_limit: int
) -> tuple[list[Work], tuple[int, str] | None]:
    """Up to ``limit`` Work matching ``query`` after the cursor ``after`` (created ms, id), and
    the cursor to continue from (``None``: no more). With an input filter at most ``scan_limit``
    rows are read; a page cut short there still returns a cursor."""
    where: list[str] = []
    params: list[object] = []
    for column, value in (("id", query.id), ("binding", query.binding),
                          ("status", query.status), ("scope", query.scope)):  # fmt: skip
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if query.id_prefix:
        where.append("id >= ? AND id < ?")
        params += [query.id_prefix, _prefix_end(query.id_prefix)]
    if query.since_ms is not None:
        where.append("created_at_ms >= ?")
        params.append(query.since_ms)
    if query.until_ms is not None:
        where.append("created_at_ms < ?")
        params.append(query.until_ms)
    direction = "<" if query.newest_first else ">"
    order = "DESC" if query.newest_first else "ASC"
    if after is not None:
        where.append(f"(created_at_ms, id) {direction} (?, ?)")
        params += [after[0], after[1]]
    where_sql = "WHERE " + " AND ".join(where) if where else ""
    # Led by the column a filter fixes, the order is that filter's index order: the planner
    # then reads (binding|status|scope, created_at_ms, id) in order rather than the created
    # index with a filter (PostgreSQL chose that for a common binding: 10 rows read per match).
    fixed = next((c for c in ("binding", "status", "scope") if getattr(query, c) is not None), None)
    lead = f"{fixed} {order}, " if fixed else ""
    order_sql = f"ORDER BY {lead}created_at_ms {order}, id {order}"
    outer_order = f"ORDER BY created_at_ms {order}, id {order}"  # over rows of one fixed value
    if query.input_key is None:
        rows = cx.rows(
            f"SELECT data, created_at_ms, id FROM conduit_work {where_sql} {order_sql} LIMIT ?",
            (*params, limit + 1),
        )
        page = rows[:limit]
        more = len(rows) > limit
        position = (int(page[-1][1]), str(page[-1][2])) if more and page else None
        return [Codec.work.decode(r[0]) for r in page], position
    # The input filter: the match is the database's (SQLite ``json_extract``, PostgreSQL
    # ``->>``) over at most ``scan_limit`` rows in page order, read through the filters' index;
    # only the matches come back, then their records.
    scanned = (
        f"SELECT created_at_ms, id, first_input FROM conduit_work {where_sql} {order_sql} LIMIT ?"
    )
    value = _INPUT_PG if cx.has_sequences else _INPUT_SQLITE
    key = query.input_key if cx.has_sequences else f'$."{query.input_key}"'
    hits = cx.rows(
        f"SELECT created_at_ms, id FROM ({scanned}) AS s WHERE {value} = ? {outer_order} LIMIT ?",
        (*params, scan_limit, key, query.input_value or "", limit + 1),
    )
    if len(hits) > limit:
        nxt: tuple[int, str] | None = (int(hits[limit - 1][0]), str(hits[limit - 1][1]))
    else:
        # Fewer matches than a page: continue after the last row read, if it read its bound.
        reverse = "ASC" if query.newest_first else "DESC"
        keys = f"SELECT created_at_ms, id FROM conduit_work {where_sql} {order_sql} LIMIT ?"
        last = cx.rows(
            f"SELECT created_at_ms, id, (SELECT COUNT(*) FROM ({keys}) AS c) FROM ({keys}) "
            f"AS s ORDER BY created_at_ms {reverse}, id {reverse} LIMIT 1",
            (*params, scan_limit, *params, scan_limit),
        )
        full = bool(last) and int(last[0][2]) == scan_limit
        nxt = (int(last[0][0]), str(last[0][1])) if full else None
    return _load_in_order(cx, [str(h[1]) for h in hits[:limit]]), nxt


#: A first input's value of the key as text, per backend (numbers as JSON writes them; booleans
#: are stored as ``"true"``/``"false"``, see ``_sql.first_input_column``).
_INPUT_SQLITE = "CAST(json_extract(s.first_input, ?) AS TEXT)"
_INPUT_PG = "(CAST(s.first_input AS jsonb) ->> ?)"


def _load_in_order(cx: Cx, ids: list[str]) -> list[Work]:
    if not ids:
        return []
    marks = ", ".join("?" for _ in ids)
    rows = cx.rows(f"SELECT id, data FROM conduit_work WHERE id IN ({marks})", tuple(ids))
    by_id = {str(r[0]): Codec.work.decode(r[1]) for r in rows}
    return [by_id[i] for i in ids if i in by_id]
