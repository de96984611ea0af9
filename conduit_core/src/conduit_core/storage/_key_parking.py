"""Parked Work: ready Work of a concurrency key at its limit, kept out of the claim's read.

A claim reads the ready queue through ``conduit_work_ready_order`` and refuses Work whose key
is at its limit (``_keys.READY_KEY_FILTER``). Filtered while walking, such Work was passed by
row by row at every claim: a key with a backlog of 20,000 and its slot held cost each claim
20 ms on SQLite and 43 ms on PostgreSQL. So a ready Work is *parked* (``key_parked`` = 1, out
of that index, still ``claimable`` for every count and listing) when it becomes claimable
while its key's slot holders and the key's unparked ready Work ahead of it in claim order
already fill the key's limit:

- a Work that becomes claimable through ``save_work`` is decided by the write itself
  (``park_column``, from the key's counts as the statement sees them);
- a bulk insert decides in memory, the batch's Work of a key in claim order
  (``parked_on_insert``, from two reads of the keys' counts, sent together).

A write that frees a place of the key (an attempt that no longer holds its slot, a Work of
the key that leaves the ready queue) unparks the key's oldest parked Work as far as the limit
has room (``unpark_key``, in the same transaction). What those writes cannot see, a parking
that committed concurrently with them on PostgreSQL, the daemon's sweep mends
(``Store.unpark_keys``: every key with parked Work, its room counted afresh). Parking only
ever costs order within a key or a moment's wait, never a start beyond the limit: the claim's
locked count (``_keys.KeyCounts``) still decides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from conduit_core.model import Work
from conduit_core.storage._cx import Cx, chunks
from conduit_core.storage._unsafe import unsafe

__all__ = [
    "park_column",
    "parked_keys_after",
    "parked_on_insert",
    "unpark_key",
    "unpark_keys",
]

#: Ids per ``IN (…)`` list.
_CHUNK = 500


def _holders(key: str) -> str:
    return (
        "(SELECT COUNT(*) FROM conduit_execution k "
        f"WHERE k.concurrency_key = {key} AND k.holds_slot = 1)"
    )


def _unparked(key: str, up_to: str | None = None) -> str:
    """The key's unparked ready Work; ``up_to``: of those, the ones ready no later."""
    ranked = "" if up_to is None else f" AND u.ready_since <= {up_to}"
    return (
        f"(SELECT COUNT(*) FROM conduit_work u WHERE u.concurrency_key = {key} "
        f"AND u.claimable = 1 AND u.key_parked = 0 AND u.concurrency_key IS NOT NULL{ranked})"
    )


def park_column(new_claimable: str, new_rank: str) -> str:
    """The ``key_parked = …`` assignment of a Work's update, ``new_claimable`` and
    ``new_rank`` the values it writes to ``claimable`` and ``ready_since`` (each a ``?`` or a
    column): 0 for a Work without a key or leaving the ready queue, unchanged for one that stays
    in it, and for one that enters it, 1 when its key's slot holders and the unparked ready Work
    ahead of it in claim order fill its ``key_limit`` already. (Counting only those ahead, a
    Work of higher priority than the key's unparked Work is not parked behind them: it goes
    first, as it did when nothing was parked; they stay unparked beyond the limit, each passed
    by at a claim until it starts.)"""
    key = "conduit_work.concurrency_key"
    return (
        f"key_parked = CASE WHEN {key} IS NULL OR {new_claimable} = 0 THEN 0 "
        "WHEN conduit_work.claimable = 1 THEN conduit_work.key_parked "
        f"WHEN {_holders(key)} + {_unparked(key, new_rank)} >= conduit_work.key_limit THEN 1 "
        "ELSE 0 END"
    )


def _room(key: str) -> str:
    """How many more of the key's Work its limit has room for (the limit of its oldest parked
    Work, less its slot holders and unparked ready Work; NULL when it has none parked)."""
    return (
        "((SELECT h.key_limit FROM conduit_work h "
        f"WHERE h.concurrency_key = {key} AND h.claimable = 1 AND h.key_parked = 1 "
        f"ORDER BY h.ready_since, h.id LIMIT 1) - {_holders(key)} - {_unparked(key)})"
    )


#: The key's oldest parked Work made unparked, as many as its limit has room for (the limit of
#: its oldest parked Work; none when it has none). Four parameters, each the key. Where rows
#: are locked, a row another transaction holds is passed by (``SKIP LOCKED``): two batches
#: unparking the same two keys in opposite orders never wait for each other (a deadlock), and
#: two transactions each freeing a place of one key unpark one Work each.
_UNPARK_SQL = (
    "UPDATE conduit_work SET key_parked = 0 WHERE id IN ("
    "SELECT p.id FROM conduit_work p "
    "WHERE p.concurrency_key = ? AND p.claimable = 1 AND p.key_parked = 1 "
    "ORDER BY p.ready_since, p.id "
    f"LIMIT (SELECT CASE WHEN r.n > 0 THEN r.n ELSE 0 END FROM (SELECT {_room('?')} AS n) r))"
)
_UNPARK_LOCKED_SQL = _UNPARK_SQL[:-1] + " FOR UPDATE OF p SKIP LOCKED)"


def _unpark_sql(cx: Cx) -> str:
    return _UNPARK_LOCKED_SQL if cx.locks_rows else _UNPARK_SQL


def unpark_key(cx: Cx, key: str | None) -> None:
    """Unpark ``key``'s oldest parked Work as far as its limit has room (after a write that
    may have freed a place of the key; nothing when it has none)."""
    if key is not None and not unsafe("key_check"):
        cx.run(_unpark_sql(cx), (key, key, key, key))


def unpark_keys(cx: Cx, keys: Sequence[str]) -> int:
    """``unpark_key`` for each of ``keys`` (the sweep): how many Work were unparked."""
    counts = [cx.count_later(_unpark_sql(cx), (key, key, key, key)) for key in keys]
    return sum(count() for count in counts)


#: The next keys with parked Work after a key, in key order (each found through the parked
#: index, however many Work a key has), each with whether its limit has room: parameters the
#: key after, the count.
_PARKED_KEYS_SQL = (
    "WITH RECURSIVE pk (key, n) AS ("
    "SELECT (SELECT MIN(w.concurrency_key) FROM conduit_work w "
    "WHERE w.claimable = 1 AND w.key_parked = 1 AND w.concurrency_key > ?), 1 "
    "UNION ALL "
    "SELECT (SELECT MIN(w.concurrency_key) FROM conduit_work w "
    "WHERE w.claimable = 1 AND w.key_parked = 1 AND w.concurrency_key > pk.key), pk.n + 1 "
    "FROM pk WHERE pk.key IS NOT NULL AND pk.n < ?) "
    f"SELECT key, CASE WHEN {_room('pk.key')} > 0 THEN 1 ELSE 0 END FROM pk "
    "WHERE key IS NOT NULL"
)


def parked_keys_after(cx: Cx, after: str | None, scan: int) -> tuple[list[str], str | None]:
    """Of the next ``scan`` keys with parked Work after ``after`` (``None``: from the first),
    those whose limit has room, and where to go on (``None``: the last key was reached). A read
    only: the sweep writes nothing when no key has room."""
    rows = cx.rows(_PARKED_KEYS_SQL, (after or "", scan))
    with_room = [str(key) for key, room in rows if room]
    return with_room, (str(rows[-1][0]) if len(rows) == scan else None)


def parked_on_insert(
    cx: Cx, ready: Sequence[Work], rank_of: Callable[[Work], int]
) -> set[str]:
    """The ids among ``ready`` (new claimable Work inserted together, in claim order, each at
    ``rank_of``) to insert parked: as ``park_column`` decides, each key's Work of the batch
    counted in that order. Two reads per chunk of keys (the slot holders, grouped; the ranks
    of the unparked ready Work, a few per key), none without keys.
    (With the key check switched off, a race detector's negative control, nothing is parked,
    so that the detector still sees the limit exceeded.)"""
    keyed = [w for w in ready if w.concurrency_key is not None]
    if not keyed or unsafe("key_check"):
        return set()
    keys = sorted({str(w.concurrency_key) for w in keyed})
    holder_reads, unparked_reads = [], []
    for chunk in chunks(keys, _CHUNK):
        marks = ", ".join("?" for _ in chunk)
        holder_reads.append(cx.later(
            "SELECT concurrency_key, COUNT(*) FROM conduit_execution WHERE holds_slot = 1 "
            f"AND concurrency_key IN ({marks}) GROUP BY concurrency_key", chunk))  # fmt: skip
        unparked_reads.append(cx.later(
            "SELECT concurrency_key, ready_since FROM conduit_work WHERE claimable = 1 "
            f"AND key_parked = 0 AND concurrency_key IN ({marks})", chunk))  # fmt: skip
    holders: Counter[str] = Counter()
    for read in holder_reads:
        for key, count in read():
            holders[str(key)] += int(count)
    unparked: dict[str, list[int]] = {}  # per key, the ranks of its unparked ready Work
    for read in unparked_reads:
        for key, rank in read():
            unparked.setdefault(str(key), []).append(int(rank))
    taken: Counter[str] = Counter()  # per key, the batch's Work unparked so far
    parked: set[str] = set()
    for work in keyed:
        key = str(work.concurrency_key)
        ahead = sum(1 for rank in unparked.get(key, ()) if rank <= rank_of(work))
        if holders[key] + ahead + taken[key] >= work.key_limit:
            parked.add(work.id)
        else:
            taken[key] += 1
    return parked
