"""Dedup and debounce: a submit under a key joins the Work that holds the key, or creates one.

The decision is one row of ``conduit_submit_key`` per (kind, binding, key), taken in the
submitting transaction: ``INSERT … ON CONFLICT DO NOTHING`` either makes this submit the key's
first holder, or finds the row and locks it (``FOR UPDATE``). On PostgreSQL (READ COMMITTED) a
second submitter's insert waits on the unique index for the first to commit, then reads the
committed holder; a submitter that finds a stale holder and takes the key over makes every
other waiter read the new holder when their lock is granted. SQLite has one writer. So any
number of submitters on any number of daemons decide one after another, and exactly one of a
burst creates a Work.

A debounced Work holds its start with a timer (``debounce/<work>/<due>``); pushing the start
replaces that timer under the key's lock. The timer's firing and a push both delete the current
timer row first, so whichever deletes it decides: a push that finds it gone (fired) creates a new
Work instead of joining one that may already run.

A row that can name nothing any more is deleted by a sweep (``Store.release_submit_keys``, a
step of the daemon's passes: ``releasable_submit_keys`` reads, ``delete_submit_keys`` writes):
its Work has ended and, if it was created under a window, the window has passed
(``expires_at_ms``). The sweep deletes a row only if it still names the Work it judged
(``work_id = ?``): on PostgreSQL a submitter that holds the row (locked, pointing it at a
new Work) makes the delete wait and then miss it. A submitter whose conflicting insert met a
row the sweep then deleted finds no row to lock and inserts again.
"""

from __future__ import annotations

import msgspec

from conduit_core.model import DebounceHold, Event, Timer, TimerKind, Work, WorkStatus
from conduit_core.storage._ops_misc import arm_timer, disarm_timer
from conduit_core.storage._ops_work import accept_event, create_work
from conduit_core.storage._sql import Cx, find_work, first, load_work, save_work
from conduit_core.storage._submit_key import DedupScope, SubmitKey, Submitted
from conduit_core.storage._unsafe import fault, unsafe

__all__ = ["KeyRow", "delete_submit_keys", "releasable_submit_keys", "submit_keyed"]

#: How many times a submit inserts its key again after the row it met was released under it.
_RELEASED_RETRIES = 3

#: Rows one DELETE of the release names (4 parameters each: under SQLite's oldest limit, 999).
_DELETE_CHUNK = 200

_TERMINAL = frozenset(str(s) for s in WorkStatus if s.terminal)


def submit_keyed(
    cx: Cx, work: Work, first_input: Event | None, key: SubmitKey, now_ms: int
) -> Submitted:
    # An explicit id already taken: ``create_work`` refuses (``work_exists``) and the store rolls
    # this operation back whole, the key's row with it.
    created = _with_key(work, key, now_ms)
    ident = (key.kind, work.binding, key.key)
    if unsafe("submit_key_lock"):
        return _unlocked(cx, created, first_input, key, now_ms, ident)
    expires = _expiry(created, key)
    for _ in range(_RELEASED_RETRIES):
        taken = cx.count(
            "INSERT INTO conduit_submit_key (kind, binding, submit_key, work_id, expires_at_ms) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (*ident, work.id, expires),
        )
        fault("store.submit_key_read")  # the key's row is this submit's until commit
        if taken:
            return Submitted(_create(cx, created, first_input), deduplicated=False)
        fault("store.submit_key_met")  # the row exists; a release sweep may delete it now
        row = first(
            cx,
            "SELECT work_id, expires_at_ms FROM conduit_submit_key "
            "WHERE kind = ? AND binding = ? AND submit_key = ? FOR UPDATE",
            ident,
        )
        if row is not None:
            break
        # released by the sweep since the insert met it: insert again
    else:
        raise AssertionError(f"submit key {ident!r} released {_RELEASED_RETRIES} times at once")
    joined = _join(cx, str(row[0]), _stored_expiry(row[1]), first_input, key, now_ms)
    if joined is not None:
        return Submitted(joined, deduplicated=True)
    cx.run(
        "UPDATE conduit_submit_key SET work_id = ?, expires_at_ms = ? "
        "WHERE kind = ? AND binding = ? AND submit_key = ?",
        (work.id, expires, *ident),
    )
    fault("store.submit_key_taken_over")  # the row names this submit's Work, uncommitted
    return Submitted(_create(cx, created, first_input), deduplicated=False)


def _unlocked(
    cx: Cx, work: Work, first_input: Event | None, key: SubmitKey, now_ms: int,
    ident: tuple[str, str, str],
) -> Submitted:
    """The negative control's submit: read the holder, then create (no insert-first, no lock)."""
    row = first(cx, "SELECT work_id, expires_at_ms FROM conduit_submit_key "
                    "WHERE kind = ? AND binding = ? AND submit_key = ?", ident)  # fmt: skip
    fault("store.submit_key_read")
    if row is not None:
        joined = _join(cx, str(row[0]), _stored_expiry(row[1]), first_input, key, now_ms)
        if joined is not None:
            return Submitted(joined, deduplicated=True)
    cx.run(
        "INSERT INTO conduit_submit_key (kind, binding, submit_key, work_id, expires_at_ms) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (kind, binding, submit_key) "
        "DO UPDATE SET work_id = excluded.work_id, expires_at_ms = excluded.expires_at_ms",
        (*ident, work.id, _expiry(work, key)),
    )
    return Submitted(_create(cx, work, first_input), deduplicated=False)


def _with_key(work: Work, key: SubmitKey, now_ms: int) -> Work:
    if not key.debounced:
        return msgspec.structs.replace(work, dedup_key=key.key)
    assert key.quiet_ms is not None
    deadline = None if key.max_wait_ms is None else now_ms + key.max_wait_ms
    due = _capped(now_ms + key.quiet_ms, deadline)
    return msgspec.structs.replace(
        work,
        dedup_key=key.key,
        debounce=DebounceHold(timer_id=_timer_id(work.id, due), due_ms=due, deadline_ms=deadline),
    )


def _create(cx: Cx, work: Work, first_input: Event | None) -> Work:
    stored = create_work(cx, work, first_input)
    if work.debounce is not None:
        arm_timer(cx, _timer(work.id, work.debounce.due_ms))
    return stored


def _join(
    cx: Cx,
    holder_id: str,
    expires_at_ms: int | None,
    first_input: Event | None,
    key: SubmitKey,
    now_ms: int,
) -> Work | None:
    """The holder this submit joins (its input added, a debounce pushed), or ``None``: the key
    no longer refers to it and the submit creates a new Work."""
    holder = find_work(cx, holder_id)
    if holder is None or not _still_holds(holder, key, now_ms, expires_at_ms):
        return None
    if not key.debounced:
        return holder
    hold = holder.debounce
    assert hold is not None
    assert key.quiet_ms is not None
    # Delete the hold's timer before touching the Work (the firing's lock order): if the firing
    # took it first, the Work is released (or about to be) and this submit starts a new one.
    if not disarm_timer(cx, hold.timer_id):
        return None
    # a later submit never pulls the start earlier, nor pushes it past the deadline
    due = max(_capped(now_ms + key.quiet_ms, hold.deadline_ms), hold.due_ms)
    arm_timer(cx, _timer(holder.id, due))
    if first_input is not None:
        accept_event(cx, _joined_input(first_input, holder.id, now_ms))
    current = load_work(cx, holder.id, lock=True)
    pushed = msgspec.structs.replace(
        current,
        debounce=msgspec.structs.replace(hold, timer_id=_timer_id(holder.id, due), due_ms=due),
        updated_at_ms=now_ms,
    )
    save_work(cx, pushed)
    return pushed


def _capped(due_ms: int, deadline_ms: int | None) -> int:
    return due_ms if deadline_ms is None else min(due_ms, deadline_ms)


def _expiry(work: Work, key: SubmitKey) -> int:
    """The key row's ``expires_at_ms`` for a Work created under ``key``: the end of its window,
    0 without one (the row names the Work until it ends)."""
    if key.debounced or key.scope is not DedupScope.WINDOW:
        return 0
    return work.created_at_ms + key.window_ms


def _stored_expiry(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _still_holds(holder: Work, key: SubmitKey, now_ms: int, expires_at_ms: int | None) -> bool:
    """Whether the key still names ``holder`` for this submit. A window is the one the Work was
    created under (``expires_at_ms``); a window submit meeting a Work created without one joins
    it within its own window while it has not ended. Every answer here turns false for good
    once the release sweep's test holds (ended, window passed), so a released row and a kept
    one answer alike."""
    if key.debounced:
        return holder.debounce is not None and not holder.status.terminal
    if key.scope is DedupScope.WINDOW:
        if expires_at_ms:  # created under a window
            return now_ms < expires_at_ms
        if expires_at_ms is not None and holder.status.terminal:  # without one, and ended
            return False
        return holder.created_at_ms > now_ms - key.window_ms
    if holder.status.terminal:
        return False
    return key.scope is DedupScope.ACTIVE or holder.last_attempt == 0


def _joined_input(first_input: Event, work_id: str, now_ms: int) -> Event:
    """The submit's input as one more pending input of the Work it joined (its id names the
    submit's own Work id, so a resend of this submit is accepted once)."""
    delivery = f"{work_id}/joined/{first_input.delivery_id}"
    return msgspec.structs.replace(
        first_input, id=delivery, delivery_id=delivery, work_id=work_id, accepted_at_ms=now_ms
    )


def _timer_id(work_id: str, due_ms: int) -> str:
    return f"debounce/{work_id}/{due_ms}"


def _timer(work_id: str, due_ms: int) -> Timer:
    return Timer(id=_timer_id(work_id, due_ms), kind=TimerKind.DEBOUNCE, due_at_ms=due_ms,
                 work_id=work_id)  # fmt: skip


#: The next rows in key order, each with its Work's status and, for a debounce key, whether its
#: hold was released (no debounce timer left: the timer's firing deletes it and clears the
#: hold in one transaction, a push swaps it in one; ``conduit_timer_work`` finds it).
_RELEASABLE_SQL = (
    "SELECT k.kind, k.binding, k.submit_key, k.work_id, k.expires_at_ms, w.status, "
    "CASE WHEN k.kind = 'debounce' AND w.id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "
    "conduit_timer t WHERE t.work_id = k.work_id AND t.id LIKE 'debounce/%') THEN 1 ELSE 0 END "
    "FROM conduit_submit_key k LEFT JOIN conduit_work w ON w.id = k.work_id "
    "WHERE (k.kind, k.binding, k.submit_key) > (?, ?, ?) "
    "ORDER BY k.kind, k.binding, k.submit_key LIMIT ?"
)

#: A key row to release: ``(kind, binding, submit_key, work_id)``, the Work it named when read.
KeyRow = tuple[str, str, str, str]


def releasable_submit_keys(
    cx: Cx, after: tuple[str, str, str] | None, scan: int, now_ms: int
) -> tuple[list[KeyRow], tuple[str, str, str] | None]:
    """The key rows among the next ``scan`` (in key order, after ``after``) that name nothing
    any more: a debounce key whose hold was released (its Work may run, it takes no more
    inputs), or a key whose Work ended and any window it was created under has passed (a row
    from before ``expires_at_ms`` existed only if it is a debounce key's); and where the next
    sweep goes on (``None``: the table's end, start again). A read: each fact is final once
    true (a released hold never returns, an ended Work never runs again, time passes), so
    :func:`delete_submit_keys` may act on them later, as long as the row still names the same
    Work."""
    rows = cx.rows(_RELEASABLE_SQL, (*(after or ("", "", "")), scan))
    released = [
        (str(kind), str(binding), str(key), str(work_id))
        for kind, binding, key, work_id, expires, status, fired in rows
        if _names_nothing(str(kind), expires, status, bool(int(fired)), now_ms)
    ]
    last = rows[-1] if len(rows) == scan else None
    return released, None if last is None else (str(last[0]), str(last[1]), str(last[2]))


def _names_nothing(
    kind: str, expires_at_ms: int | None, status: str | None, hold_released: bool, now_ms: int
) -> bool:
    if hold_released:  # a debounce key: its Work no longer takes submits
        return True
    if status is not None and str(status) not in _TERMINAL:
        return False  # its Work has not ended (a missing Work has: nothing to name)
    if expires_at_ms is None:  # written before the window end was kept: only a debounce key's
        return kind == "debounce"
    return int(expires_at_ms) <= now_ms


def delete_submit_keys(cx: Cx, rows: list[KeyRow]) -> int:
    """Delete each row that still names the Work it named when read (``work_id = ?``): a row a
    submitter pointed at a new Work meanwhile, or holds locked to do so, is left alone."""
    deleted = 0
    for start in range(0, len(rows), _DELETE_CHUNK):  # a bounded number of parameters
        chunk = rows[start : start + _DELETE_CHUNK]
        marks = ", ".join("(?, ?, ?, ?)" for _ in chunk)
        deleted += cx.count(
            "DELETE FROM conduit_submit_key "
            f"WHERE (kind, binding, submit_key, work_id) IN ({marks})",
            tuple(value for row in chunk for value in row),
        )
    return deleted
