"""Concurrency keys: at most ``key_limit`` attempts of Work with one key hold a slot at once.

The limit is kept as capacity is (``_ops_work.Slots``): before counting a key's slot holders, a
claim locks the key's counter row (``key:<key>``), all of a batch's keys in one statement in
name order, after the capacity rows. Claims of one key therefore count one after another, each
seeing the others' committed attempts; claims of different keys never wait for each other. The
count reads only attempts that hold a slot and carry a key (a partial index). A slot is freed
without the lock, so a concurrent count can only be too high for a moment: a refusal, never an
excess.

Fairness between keys is the ready read's (``READY_KEY_FILTER``): Work whose key is at its limit
is not read, so it never fills a claim's rows ahead of other keys' Work.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from conduit_core.model import Work
from conduit_core.storage._contract import ClaimRefusal, KeyWaiting
from conduit_core.storage._sql import Cx, lock_counter_rows
from conduit_core.storage._unsafe import unsafe

__all__ = ["KEY_REFUSAL_CODE", "READY_KEY_FILTER", "KeyCounts", "key_waiting", "keys_checked"]

#: The refusal (and waiting) code of a Work whose key is at its limit.
KEY_REFUSAL_CODE = "concurrency_key"

#: A ready read's filter (on ``conduit_work w``): Work without a key, or whose key has room.
#: Read from the statement's snapshot, so only an estimate: the claim checks the locked count.
READY_KEY_FILTER = (
    " AND (w.concurrency_key IS NULL OR (SELECT COUNT(*) FROM conduit_execution k "
    "WHERE k.concurrency_key = w.concurrency_key AND k.holds_slot = 1) < w.key_limit)"
)


#: Per key (and limit) of startable Work: how many, and the key's slot holders, in one grouped
#: statement. Startable as ``_ops_work`` reads it (claimable, no attempt holding its slot).
_KEY_WAITING_SQL = (
    "SELECT w.concurrency_key, w.key_limit, COUNT(*), "
    "(SELECT COUNT(*) FROM conduit_execution k "
    "WHERE k.concurrency_key = w.concurrency_key AND k.holds_slot = 1) "
    "FROM conduit_work w WHERE w.claimable = 1 AND w.concurrency_key IS NOT NULL "
    "AND NOT EXISTS (SELECT 1 FROM conduit_execution x "
    "WHERE x.work_id = w.id AND x.holds_slot = 1) "
    "GROUP BY w.concurrency_key, w.key_limit"
)


def key_waiting(cx: Cx) -> list[KeyWaiting]:
    """The keys at their limit and the startable Work they hold back (``Store.key_waiting``).

    Work of a key below its limit is not counted: the next pass may start it. A key shared by
    bindings with different limits is at its limit for each held Work's own ``key_limit``."""
    held: dict[str, KeyWaiting] = {}
    for key, limit, count, in_use in cx.rows(_KEY_WAITING_SQL):
        if int(in_use) < int(limit):
            continue
        before = held.get(str(key))
        held[str(key)] = KeyWaiting(
            key=str(key),
            limit=max(int(limit), before.limit if before else 0),
            in_use=int(in_use),
            waiting=int(count) + (before.waiting if before else 0),
        )
    return sorted(held.values(), key=lambda k: (-k.waiting, k.key))


def keys_checked() -> bool:
    """Whether claims enforce concurrency keys (a race detector's negative control switches
    ``key_check`` off; see ``_unsafe``)."""
    return not unsafe("key_check")


def _counted_already() -> None:
    """``KeyCounts.prepare_later`` with nothing to count afresh."""


class KeyCounts:
    """The slot holders of each key a transaction claims under, kept current as it claims.

    ``lock``: lock each key's counter row before counting it (a claim on a backend with
    concurrent writers); a read transaction only estimates. ``before_count``: run before a count
    (a batch's deferred claim writes, so the count includes this transaction's own claims).
    """

    def __init__(
        self, cx: Cx, *, lock: bool, before_count: Callable[[], None] | None = None
    ) -> None:
        self._cx = cx
        self._lock = lock and cx.locks_rows
        self._before_count = before_count
        self.by_key: Counter[str] = Counter()
        self._counted: set[str] = set()

    def prepare_later(self, keys: Iterable[str | None]) -> Callable[[], None]:
        """Lock the keys not yet counted (in one statement, in name order) and count their slot
        holders: sent now, taken in when the returned function is called."""
        new = sorted({key for key in keys if key is not None} - self._counted)
        if not new or not keys_checked():
            return _counted_already
        if self._lock:
            lock_counter_rows(self._cx, [f"key:{key}" for key in new])
        if self._before_count is not None:
            self._before_count()
        marks = ", ".join("?" for _ in new)
        rows = self._cx.later(
            "SELECT concurrency_key, COUNT(*) FROM conduit_execution WHERE holds_slot = 1 "
            f"AND concurrency_key IN ({marks}) GROUP BY concurrency_key",
            tuple(new),
        )

        def take_in() -> None:
            for key in new:
                self.by_key[key] = 0
            for key, count in rows():
                self.by_key[str(key)] = int(count)
            self._counted.update(new)

        return take_in

    def refusal(self, work: Work) -> ClaimRefusal | None:
        """The refusal of ``work`` when its key is at its limit, else ``None``."""
        key = work.concurrency_key
        if key is None or not keys_checked():
            return None
        self.prepare_later([key])()
        in_use = self.by_key[key]
        if in_use < work.key_limit:
            return None
        return ClaimRefusal(
            work_id=work.id,
            code=KEY_REFUSAL_CODE,
            limit_name=f"key:{key}",
            message=f"waiting for key {key!r} ({in_use} of {work.key_limit} attempts live)",
        )

    def take(self, key: str | None) -> None:
        if key is not None:
            self.by_key[key] += 1
