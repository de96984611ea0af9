"""A claim's read of the ready queue where a scope limit shapes it: each (binding, scope) with
ready Work read through its own range of ``conduit_work_ready_binding`` (binding, scope,
key_parked, ready_since, id; schema 20), so a scope's backlog is never walked by a read that
does not take it.

Filtered while walking each binding's range in claim order (``scope NOT IN ...``), a full
scope's backlog, or a limited scope's passed by the read of the rest, cost every claim a pass
over it (issue 32: 9 ms on SQLite, 11 ms on PostgreSQL a claim behind 20,000; through the
daemon, half of what it finished beside it). The pairs are found first, a probe of the index
per pair (``present_scopes_later``), then read in one statement per slice of the claim
(``scope_ranges_sql``); ``_ready_reads`` merges the slices in claim order."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from conduit_core.storage._ops_work import UNBLOCKED, work_rows_select
from conduit_core.storage._sql import Cx

#: The first scope with ready Work of the binding ``{0}`` names, after the scope ``{1}`` names
#: (``''``: the first of all), one probe of ``conduit_work_ready_binding``. PostgreSQL: a row
#: comparison and the index's order, which only this index gives (given ``binding = ?`` it
#: walked the scope index of every Work, finished or not, and filtered). SQLite: the binding
#: given, the scope a range (its recursive step used the row comparison for the binding only,
#: and walked the binding's every ready row).
_NEXT_SCOPE = {
    True: "(SELECT w.scope FROM conduit_work w WHERE w.claimable = 1 AND (w.binding, w.scope) > "
    "({0}, {1}) AND w.binding <= {0} ORDER BY w.binding, w.scope LIMIT 1)",
    False: "(SELECT w.scope FROM conduit_work w WHERE w.claimable = 1 AND w.binding = {0} "
    "AND w.scope > {1} ORDER BY w.scope LIMIT 1)",
}


#: The most (binding, scope) pairs one statement reads by range (SQLite allows 500 terms in a
#: ``UNION ALL``); a slice with more is read by walking its bindings' ranges, as before.
MAX_PAIRS = 64

#: The scopes with ready Work per binding, taken in when called (``present_scopes_later``).
PresentScopes = Callable[[], dict[str, set[str]]]


def present_scopes_later(cx: Cx, bindings: Sequence[str]) -> PresentScopes:
    """The scopes that have ready Work, per binding of ``bindings``: a skip scan of the ready
    index (a probe per scope, in one recursive statement), sent now, taken when called."""
    if not bindings:
        return dict
    mine = " UNION ALL ".join("SELECT CAST(? AS TEXT) AS binding" for _ in bindings)
    first = _NEXT_SCOPE[cx.locks_rows].format("b.binding", "''")
    after = _NEXT_SCOPE[cx.locks_rows].format("s.binding", "s.scope")
    read = cx.later(
        f"WITH RECURSIVE s (binding, scope) AS (SELECT b.binding, {first} FROM ({mine}) AS b "
        f"UNION ALL SELECT s.binding, {after} FROM s WHERE s.scope IS NOT NULL) "
        "SELECT binding, scope FROM s WHERE scope IS NOT NULL",
        tuple(bindings),
    )

    def take_in() -> dict[str, set[str]]:
        present: dict[str, set[str]] = {}
        for binding, scope in read():
            present.setdefault(str(binding), set()).add(str(scope))
        return present

    return take_in


def scope_ranges_sql(
    cx: Cx, pairs: Sequence[tuple[str, str]], filters: str, size: int
) -> tuple[str, tuple[object, ...]]:
    """One statement for the oldest ``size`` ready, unparked rows (of ``filters``, which take
    no parameter) of the (binding, scope) ``pairs``, each pair's read from its own range of the
    index and stopping at its ``LIMIT``, the oldest of them all kept: PostgreSQL, a lateral
    subquery per pair, its rows locked (``SKIP LOCKED``); SQLite, a ``UNION ALL`` of their ids,
    the rows of the oldest read after."""

    def where(pair_range: str) -> str:
        return (f"WHERE w.claimable = 1 AND {pair_range} AND "
                f"{UNBLOCKED.replace('conduit_work.', 'w.')}{filters} ")  # fmt: skip

    flat = tuple(value for pair in pairs for value in pair)
    if cx.locks_rows:
        # Row comparisons: PostgreSQL walks just the pair's range and stops at its end, in the
        # index's order, which no other index gives (given ``binding = ?`` it may walk another
        # index in claim order and filter, past every other scope's rows).
        bounds = "(w.binding, w.scope, w.key_parked) {} (mine.binding, mine.scope, 0)"
        each = (
            "(SELECT w.* FROM conduit_work w "
            + where(f"{bounds.format('>=')} AND {bounds.format('<=')}")
            + "ORDER BY w.binding, w.scope, w.key_parked, w.ready_since, w.id LIMIT ? "
            "FOR UPDATE OF w SKIP LOCKED) w"
        )
        values = ", ".join("(?, ?)" for _ in pairs)
        source = f"(VALUES {values}) AS mine (binding, scope) CROSS JOIN LATERAL {each}"
        sql = work_rows_select("", source) + "ORDER BY w.ready_since, w.id LIMIT ?"
        return sql, (*flat, size, size)
    each = (
        "SELECT * FROM (SELECT w.ready_since, w.id FROM conduit_work w "
        + where("w.binding = ? AND w.scope = ? AND w.key_parked = 0")
        + "ORDER BY w.ready_since, w.id LIMIT ?)"
    )
    oldest = (
        f"SELECT id FROM ({' UNION ALL '.join(each for _ in pairs)}) "
        "ORDER BY ready_since, id LIMIT ?"
    )
    sql = work_rows_select() + f"WHERE w.id IN ({oldest}) ORDER BY w.ready_since, w.id"
    return sql, (*(value for pair in pairs for value in (*pair, size)), size)
