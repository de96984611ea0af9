"""Leases, recovery and fenced attempt writes as synchronous operations in one transaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import msgspec

from conduit_core.errors import ConduitError, LeaseLostError, NotFoundError
from conduit_core.model import (
    Event,
    Execution,
    ExecutionStatus,
    Lease,
    RecoveryHold,
    Segment,
    Timer,
    Wait,
    Work,
    WorkStatus,
)
from conduit_core.storage._contract import (
    AttemptEnd,
    CapacityLimits,
    Claim,
    Decision,
    ExecutionChange,
    NotEligibleError,
    RecoveryRefusal,
    Settlement,
    WorkChange,
    refusal_error,
)
from conduit_core.storage._ops_budgets import stage_usage
from conduit_core.storage._ops_controls import settle_consumed
from conduit_core.storage._ops_misc import arm_timer, register_wait
from conduit_core.storage._ops_work import Slots, accept_event, new_lease
from conduit_core.storage._sql import (
    LEASE_COLUMNS,
    ONE_STATEMENT_FROM,
    Codec,
    Cx,
    as_columns,
    changed_work,
    close_open_segment,
    dump,
    first,
    first_segment,
    is_claimable,
    lease_of,
    load_execution,
    load_work,
    save_execution,
    save_leased_execution,
    save_work,
    with_new_segment,
)


def find_lease(cx: Cx, execution_id: str) -> tuple[Lease, bool] | None:
    row = first(
        cx,
        f"SELECT {LEASE_COLUMNS} FROM conduit_execution WHERE id = ? AND lease_token IS NOT NULL",
        (execution_id,),
    )
    return None if row is None else lease_of(row)


# The attempt row, which carries its lease (schema V14), locked: the row is the attempt's mutex
# for every writer, and a statement that waited for it reads its newest version, so a fence is
# checked on the current row.
_FENCE_SQL = (
    f"SELECT {LEASE_COLUMNS}, data, rev FROM conduit_execution "
    "WHERE id = ? AND lease_token IS NOT NULL FOR UPDATE"
)


def fenced(cx: Cx, lease: Lease, now_ms: int, *, check_expiry: bool = True) -> Execution:
    """The attempt, if ``lease`` still holds it; ``LeaseLostError`` otherwise."""
    return fenced_lease(cx, lease, now_ms, check_expiry=check_expiry)[0]


def fenced_lease(
    cx: Cx, lease: Lease, now_ms: int, *, check_expiry: bool = True
) -> tuple[Execution, Lease]:
    """The attempt and its stored lease, locked until commit, if ``lease`` still holds it.

    The lease and the attempt are read and locked in one statement (one round trip).
    """
    ex, stored, _ = fenced_revision(cx, lease, now_ms, check_expiry=check_expiry)
    return ex, stored


def fenced_revision(
    cx: Cx, lease: Lease, now_ms: int, *, check_expiry: bool = True
) -> tuple[Execution, Lease, int]:
    """``fenced_lease`` and the attempt row's revision as read (``rev``, schema V4)."""
    where = f"attempt {lease.execution_id} epoch {lease.epoch}"
    row = first(cx, _FENCE_SQL, (lease.execution_id,))
    if row is None:
        raise LeaseLostError(f"{where}: no lease (finished, parked or cancelled)")
    stored, released = lease_of(row)
    if stored.epoch != lease.epoch:
        raise LeaseLostError(f"{where}: superseded by epoch {stored.epoch}")
    if stored.token != lease.token:
        raise LeaseLostError(f"{where}: the lease token does not match")
    if released:
        raise LeaseLostError(f"{where}: the lease was released")
    if check_expiry and stored.expires_at_ms <= now_ms:
        raise LeaseLostError(f"{where}: the lease expired at {stored.expires_at_ms} ms")
    ex = Codec.execution.decode(row[8])
    if not ex.status.live:
        raise LeaseLostError(f"{where}: the attempt is {ex.status}")
    if ex.epoch != lease.epoch:
        raise LeaseLostError(f"{where}: the attempt is at epoch {ex.epoch}")
    return ex, stored, int(row[9])


def renew_lease(cx: Cx, lease: Lease, now_ms: int) -> Lease:
    _, stored = fenced_lease(cx, lease, now_ms)
    # A clock stepped back must never shorten the lease: keep the later expiry.
    expiry = max(stored.expires_at_ms, now_ms + stored.duration_ms)
    # No revision bump: a renewal changes nothing a known-revision writer relies on (a later
    # expiry only widens its fence).
    cx.run(
        "UPDATE conduit_execution SET lease_expires_at_ms = ? WHERE id = ?",
        (expiry, lease.execution_id),
    )
    return msgspec.structs.replace(stored, expires_at_ms=expiry)


#: Leases renewed per statement by ``renew_leases`` (well under every backend's bound).
_RENEW_CHUNK = 500


def renew_leases(cx: Cx, leases: Sequence[Lease], now_ms: int) -> list[Lease]:
    """``renew_lease`` for many leases at once: two statements per chunk, not a fenced
    read-modify-write each. A lease that fails its fence is left out of the result."""
    renewed: list[Lease] = []
    wanted = {lease.execution_id: lease for lease in leases}
    ids = sorted(wanted)
    for start in range(0, len(ids), _RENEW_CHUNK):
        chunk = ids[start : start + _RENEW_CHUNK]
        marks = ", ".join("?" for _ in chunk)
        # The attempt rows locked in id order (see _FENCE_SQL): the fence reads the attempt's
        # own epoch and live flag from its columns, no document decoded.
        rows = cx.rows(
            f"SELECT {LEASE_COLUMNS}, epoch, live FROM conduit_execution "
            f"WHERE id IN ({marks}) AND lease_token IS NOT NULL ORDER BY id FOR UPDATE",
            tuple(chunk),
        )
        held: list[Lease] = []
        for row in rows:
            stored, released = lease_of(row)
            mine = wanted[stored.execution_id]
            if (
                released
                or stored.epoch != mine.epoch
                or stored.token != mine.token
                or stored.expires_at_ms <= now_ms
                or not row[9]
                or int(row[8]) != mine.epoch
            ):
                continue  # lost: the holder learns it from its absence
            held.append(stored)
        if not held:
            continue
        marks = ", ".join("?" for _ in held)
        # A clock stepped back must never shorten a lease: keep the later expiry.
        cx.run(
            "UPDATE conduit_execution SET lease_expires_at_ms = CASE WHEN lease_expires_at_ms > "
            "? + lease_duration_ms THEN lease_expires_at_ms ELSE ? + lease_duration_ms END "
            f"WHERE id IN ({marks})",
            (now_ms, now_ms, *(lease.execution_id for lease in held)),
        )
        renewed.extend(
            msgspec.structs.replace(
                lease, expires_at_ms=max(lease.expires_at_ms, now_ms + lease.duration_ms)
            )
            for lease in held
        )
    return renewed


def release_lease(cx: Cx, lease: Lease, now_ms: int) -> None:
    fenced(cx, lease, now_ms, check_expiry=False)
    # A released lease reads as expired, so recovery finds it through the expiry index; the
    # revision moves on, so no holder takes the known-revision fast path past it.
    cx.run(
        "UPDATE conduit_execution SET rev = rev + 1, lease_released = 1, lease_expires_at_ms = "
        "CASE WHEN lease_expires_at_ms < ? THEN lease_expires_at_ms ELSE ? END WHERE id = ?",
        (now_ms, now_ms, lease.execution_id),
    )


def release_leases_of(cx: Cx, owner: str, now_ms: int) -> int:
    # The attempt rows in id order: the order every writer of several attempts locks them in
    # (see _FENCE_SQL), so this cannot deadlock with a fenced write or a recovery claim of one of
    # them. Only a live attempt holds a lease: the owner's are found through the live attempts'
    # expiry index (the subquery: SQLite would rather walk the whole table in id order), then
    # locked in id order, each checked again on its newest version.
    rows = cx.rows(
        "SELECT id FROM conduit_execution WHERE id IN (SELECT id FROM conduit_execution "
        "WHERE live = 1 AND lease_expires_at_ms IS NOT NULL AND lease_owner = ?) AND live = 1 "
        "AND lease_owner = ? AND lease_released = 0 AND lease_token IS NOT NULL "
        "ORDER BY id FOR UPDATE",
        (owner, owner),
    )
    if not rows:
        return 0
    # Released the way release_lease releases one: the owner's later writes are refused and
    # recovery finds the attempts through the expiry index at once.
    cx.run(
        "UPDATE conduit_execution SET rev = rev + 1, lease_released = 1, lease_expires_at_ms = "
        "CASE WHEN lease_expires_at_ms < ? THEN lease_expires_at_ms ELSE ? END "
        "WHERE live = 1 AND lease_expires_at_ms IS NOT NULL AND lease_owner = ? "
        "AND lease_released = 0 AND lease_token IS NOT NULL",
        (now_ms, now_ms, owner),
    )
    return len(rows)


#: An attempt's pinned binding, read from its document, per backend.
_PINNED_BINDING_SQLITE = "json_extract(data, '$.snapshot.binding')"
_PINNED_BINDING_PG = "((data::jsonb) #>> '{snapshot,binding}')"


def expired_attempts(
    cx: Cx, now_ms: int, limit: int, skip_bindings: Sequence[str] = ()
) -> list[Execution]:
    """The ``limit`` attempts whose lease expired first, none of ``skip_bindings`` (bindings the
    reader lacks a label for: left to a daemon that has it). Left out in the read itself: taken
    out after it, they filled every read once there were ``limit`` of them, and no other expired
    attempt was recovered by that daemon."""
    skip = ""
    if skip_bindings:
        pinned = _PINNED_BINDING_PG if cx.has_sequences else _PINNED_BINDING_SQLITE
        skip = f"AND {pinned} NOT IN ({', '.join('?' for _ in skip_bindings)}) "
    rows = cx.rows(
        "SELECT data FROM conduit_execution WHERE live = 1 AND lease_expires_at_ms <= ? "
        f"{skip}ORDER BY lease_expires_at_ms LIMIT ?",
        (now_ms, *skip_bindings, limit),
    )
    return [Codec.execution.decode(r[0]) for r in rows]


def claim_recovery(cx: Cx, execution_id: str, owner: str, now_ms: int, lease_ms: int) -> Claim:
    # The attempt row locked first (the attempt's mutex); the lease read after it is current.
    ex = load_execution(cx, execution_id, lock=True)
    found = find_lease(cx, execution_id)
    ex, lease = _recovered(ex, found, owner, now_ms, lease_ms)
    # A held recovery's row is written as it was, under its new lease: its revision moves on.
    save_leased_execution(cx, ex, lease)
    return Claim(execution=ex, lease=lease, work=load_work(cx, ex.work_id))


def _recovered(
    ex: Execution, found: tuple[Lease, bool] | None, owner: str, now_ms: int, lease_ms: int
) -> tuple[Execution, Lease]:
    """The recovery claim of the locked attempt ``ex`` whose lease is ``found``: the attempt
    as it is to be written and its new lease; ``NotEligibleError`` if it is not recoverable."""
    if not ex.status.live:
        raise NotEligibleError(f"attempt {ex.id} is {ex.status}, not recoverable")
    if found is not None and not found[1] and found[0].expires_at_ms > now_ms:
        raise NotEligibleError(
            f"attempt {ex.id} is held until {found[0].expires_at_ms} ms (epoch {found[0].epoch})"
        )
    if ex.recovery_hold is not None:
        # Trying a held recovery again is the same recovery: nothing was adopted since, so the
        # epoch (the one a person confirms the stop for) and the open segment stay; the new
        # token alone fences whoever tried before.
        return ex, new_lease(ex, owner, now_ms, lease_ms)
    epoch = ex.epoch + 1
    previous = ex.segments[-1] if ex.segments else None
    segment = Segment(
        epoch=epoch,
        started_at_ms=now_ms,
        recovered=True,
        pin=previous.pin if previous is not None else None,
    )
    ex = msgspec.structs.replace(
        with_new_segment(ex, segment, now_ms), epoch=epoch, status=ExecutionStatus.RECOVERING
    )
    return ex, new_lease(ex, owner, now_ms, lease_ms)


#: Attempts per set-based recovery statement (6 or 7 parameters a row: well under SQLite's
#: 32,766 and PostgreSQL's 65,535 bound parameters).
_RECOVER_CHUNK = 1_000


def claim_recoveries(
    cx: Cx, execution_ids: Sequence[str], owner: str, now_ms: int, lease_ms: int
) -> tuple[list[Claim | RecoveryRefusal], dict[str, int]]:
    """``claim_recovery`` for many attempts, set-based: five statements per chunk of up to
    ``_RECOVER_CHUNK`` instead of about seven per attempt. One entry per distinct id, in the
    order given (an attempt that ``claim_recovery`` would refuse is a ``RecoveryRefusal``), and
    the revision each claimed row was written at (the holder's ``Known`` row)."""
    wanted = list(dict.fromkeys(execution_ids))
    done: dict[str, Claim | RecoveryRefusal] = {}
    revs: dict[str, int] = {}
    ids = sorted(wanted)
    for start in range(0, len(ids), _RECOVER_CHUNK):
        chunk = ids[start : start + _RECOVER_CHUNK]
        done.update(_claim_chunk(cx, chunk, owner, now_ms, lease_ms, revs))
    return [done[execution_id] for execution_id in wanted], revs


def _claim_chunk(
    cx: Cx, ids: list[str], owner: str, now_ms: int, lease_ms: int, revs: dict[str, int]
) -> dict[str, Claim | RecoveryRefusal]:
    marks = ", ".join("?" for _ in ids)
    # The attempt rows, with their leases (schema V14), locked in id order (each attempt's mutex,
    # see _FENCE_SQL: two batches, a renewal or a fenced write lock the attempts they share in
    # one order).
    attempts = cx.rows(
        f"SELECT id, data, rev, {LEASE_COLUMNS} FROM conduit_execution WHERE id IN ({marks}) "
        "ORDER BY id FOR UPDATE",
        tuple(ids),
    )
    found = {row[0]: lease_of(row[3:]) for row in attempts if row[7] is not None}
    out: dict[str, Claim | RecoveryRefusal] = {
        execution_id: RecoveryRefusal(
            execution_id=execution_id,
            code=NotFoundError.code,
            message=f"unknown execution {execution_id!r}",
        )
        for execution_id in ids
    }
    claimed: list[tuple[Execution, Lease]] = []
    for execution_id, data, rev, *_ in attempts:
        revs[execution_id] = int(rev) + 1  # as written below (the row is locked until commit)
        try:
            claimed.append(
                _recovered(
                    Codec.execution.decode(data), found.get(execution_id), owner, now_ms, lease_ms
                )
            )
        except NotEligibleError as exc:
            del revs[execution_id]
            out[execution_id] = RecoveryRefusal(
                execution_id=execution_id, code=exc.code, message=exc.message
            )
    if not claimed:
        return out
    # Every claimed attempt written with its new lease, its revision bumped (a held recovery's
    # row is rewritten as it was: its epoch and segment stay): the rows are locked, so the writes
    # are held and go as one statement (``Cx.defer``).
    for ex, lease in claimed:
        save_leased_execution(cx, ex, lease, locked=True)
    work_ids = sorted({ex.work_id for ex, _ in claimed})
    works = {
        work.id: work
        for work in (
            Codec.work.decode(row[0])
            for row in cx.rows(
                f"SELECT data FROM conduit_work WHERE id IN ({', '.join('?' for _ in work_ids)})",
                tuple(work_ids),
            )
        )
    }
    for ex, lease in claimed:
        work = works.get(ex.work_id)
        if work is None:  # cannot be: an attempt's Work is never deleted
            raise NotFoundError("work", ex.work_id)
        out[ex.id] = Claim(execution=ex, lease=lease, work=work)
    return out


def resume_attempt(
    cx: Cx,
    execution_id: str,
    owner: str,
    now_ms: int,
    lease_ms: int,
    wake_event_id: str | None,
    capacity: CapacityLimits | None,
) -> Claim:
    ex = load_execution(cx, execution_id, lock=True)
    if ex.status is not ExecutionStatus.PARKED:
        raise NotEligibleError(f"attempt {execution_id} is {ex.status}, not parked")
    work = load_work(cx, ex.work_id, lock=True)
    if work.status.terminal:
        raise NotEligibleError(f"work {work.id!r} is {work.status}")
    if first(cx, "SELECT 1 FROM conduit_execution WHERE work_id = ? AND live = 1", (work.id,)):
        raise NotEligibleError(f"work {work.id!r} has a live attempt")
    slots = Slots(cx, capacity) if capacity is not None else None
    if slots is not None and (
        refused := slots.refusal(work.id, ex.snapshot.pool, ex.scope) or slots.keys.refusal(work)
    ):
        raise refusal_error(refused)
    epoch = ex.epoch + 1
    ex = msgspec.structs.replace(
        with_new_segment(ex, first_segment(epoch, now_ms, wake_event_id), now_ms),
        epoch=epoch,
        status=ExecutionStatus.RESUMING,
    )
    lease = new_lease(ex, owner, now_ms, lease_ms)
    save_leased_execution(cx, ex, lease)
    cx.run("DELETE FROM conduit_wait WHERE execution_id = ?", (execution_id,))
    work = msgspec.structs.replace(work, status=WorkStatus.RUNNING, updated_at_ms=now_ms)
    save_work(cx, work)
    return Claim(execution=ex, lease=lease, work=work)


def adoptable(cx: Cx, lease: Lease) -> bool:
    row = first(cx, "SELECT data FROM conduit_execution WHERE id = ?", (lease.execution_id,))
    if row is None:
        return False
    ex = Codec.execution.decode(row[0])
    if not ex.status.live or ex.epoch < lease.epoch:
        return False
    return not load_work(cx, ex.work_id).status.terminal


def _kept_identity(before: Execution, after: Execution) -> Execution:
    return msgspec.structs.replace(
        after,
        id=before.id,
        work_id=before.work_id,
        attempt=before.attempt,
        epoch=before.epoch,
        snapshot=before.snapshot,
        scope=before.scope,
        started_at_ms=before.started_at_ms,
    )


class Known(NamedTuple):
    """An attempt row as its lease holder last read or wrote it: while the row is still at
    ``rev`` its document is ``execution`` (every write of the row bumps ``rev``, and so does
    every lease write but a renewal)."""

    token: str
    rev: int
    execution: Execution


# The fence of ``fenced`` as one statement's WHERE, over the attempt row at a known revision.
# ``live`` and ``holds_slot`` are not set: the row is live (the WHERE) and stays live
# (``_check_live``), so both stay 1, and SQLite leaves the partial indexes over them untouched
# (an UPDATE that names a column maintains every index on it: 13 → 9 µs per write, c = 64).
_KNOWN_UPDATE_SQL = (
    "UPDATE conduit_execution SET status = ?, data = ?, rev = rev + 1 "
    "WHERE id = ? AND rev = ? AND epoch = ? AND live = 1 AND lease_token = ? "
    "AND lease_released = 0 AND lease_expires_at_ms > ?"
)


def update_attempt(
    cx: Cx, lease: Lease, change: ExecutionChange, now_ms: int, known: Known | None = None
) -> Known:
    """Apply ``change`` to the attempt ``lease`` holds; the attempt as written, and its revision.

    With ``known`` (what this holder last saw) the write is one statement: the row is updated
    only while it is still at that revision, live at the lease's epoch, and the lease is this
    one, unreleased and unexpired: the checks ``fenced`` makes, made by the database on the
    current row (PostgreSQL rechecks a row another transaction updated meanwhile against the
    whole WHERE before writing it; a lease write bumps ``rev`` too, so a concurrently changed
    lease fails the recheck on the attempt row). Any other outcome falls back to the locked
    read-modify-write, which raises the precise ``LeaseLostError``. Either way nothing is
    written before every check passed, so the operation needs no savepoint of its own.
    """
    fast = _known_update(lease, change, now_ms, known)
    if fast is not None and cx.count_or_restart(_KNOWN_UPDATE_SQL, fast[1].params()) == 1:
        return fast[0]
    return _fenced_update(cx, lease, change, now_ms)


def update_attempt_later(
    cx: Cx, lease: Lease, change: ExecutionChange, now_ms: int, known: Known | None = None
) -> Callable[[], Known]:
    """``update_attempt`` in two steps: its one statement (with ``known``) is sent now, and its
    count taken when the returned function is called, so a batch of them shares one round
    trip. A count of 0 wrote nothing: the function then goes on as ``update_attempt`` does,
    with the locked read-modify-write (which, in the batch's order, runs after the statements
    sent before it: as if the operation ran there, whole)."""
    return _sent_alone(cx, _known_update(lease, change, now_ms, known), lease, change, now_ms)


def _sent_alone(
    cx: Cx,
    fast: tuple[Known, _KnownWrite] | None,
    lease: Lease,
    change: ExecutionChange,
    now_ms: int,
) -> Callable[[], Known]:
    """``update_attempt_later`` once ``_known_update`` has given ``fast``."""
    if fast is None:
        return partial(_fenced_update, cx, lease, change, now_ms)
    counted = cx.count_later(_KNOWN_UPDATE_SQL, fast[1].params())
    return partial(_written_or_fenced, lambda: counted() == 1, fast[0], cx, lease, change, now_ms)


# ``_KNOWN_UPDATE_SQL`` for several attempts in one statement, one array parameter per column
# (``Cx.has_arrays``): each row of the arrays is one attempt's write under the same WHERE, and
# the ids returned are those written. One text for any count, so it stays prepared. The arrays
# go in binary (``%b``): an array of documents in text form is escaped element by element in
# Python, ~50x the cost.
_KNOWN_UPDATES_SQL = (
    "UPDATE conduit_execution SET status = v.status, data = v.data, "
    "rev = conduit_execution.rev + 1 "
    "FROM unnest(%b::text[], %b::text[], %b::text[], %b::bigint[], %b::bigint[], %b::text[], "
    "%b::bigint[]) AS v(id, status, data, rev, epoch, token, now_ms) "
    "WHERE conduit_execution.id = v.id AND conduit_execution.rev = v.rev "
    "AND conduit_execution.epoch = v.epoch AND conduit_execution.live = 1 "
    "AND conduit_execution.lease_token = v.token AND conduit_execution.lease_released = 0 "
    "AND conduit_execution.lease_expires_at_ms > v.now_ms "
    "RETURNING conduit_execution.id"
)


def update_attempts_later(
    cx: Cx,
    calls: Sequence[tuple[Lease, ExecutionChange, int, Known | None]],
) -> list[Callable[[], Known]]:
    """``update_attempt_later`` for several attempts at once: the known-revision writes of the
    distinct attempts go in one statement, whose returned ids are the rows written. Each row is
    written under the WHERE its own statement would have had, so the outcome is each
    ``update_attempt_later``'s: written where the statement was sent, or, if its row was not
    written, the locked read-modify-write where its outcome is taken. A second write of the
    same attempt in the calls goes that way too (its known revision is the first one's, which
    that write, if it happened, has left behind).

    A backend without array parameters (SQLite, in process: one statement each costs what one
    for all would, as measured) takes each as ``update_attempt_later``."""
    fasts: list[tuple[Known, _KnownWrite] | Exception | None] = []
    for lease, change, now_ms, known in calls:
        try:
            fasts.append(_known_update(lease, change, now_ms, known))
        except Exception as exc:  # the change refused: that operation's error, nothing sent
            fasts.append(exc)
    rows: dict[str, _KnownWrite] = {}  # per distinct attempt, its first write's row
    for fast in fasts:
        if cx.has_arrays and isinstance(fast, tuple) and fast[1].id not in rows:
            rows[fast[1].id] = fast[1]
    columns = as_columns(rows.values())
    take = cx.later(_KNOWN_UPDATES_SQL, columns) if rows else list
    written: set[str] | None = None

    def was_written(execution_id: str) -> bool:
        nonlocal written
        if written is None:
            written = {str(r[0]) for r in take()}
        return execution_id in written

    outcomes: list[Callable[[], Known]] = []
    for (lease, change, now_ms, _), fast in zip(calls, fasts, strict=True):
        if isinstance(fast, Exception):
            outcomes.append(partial(_raise, fast))
        elif not cx.has_arrays:
            outcomes.append(_sent_alone(cx, fast, lease, change, now_ms))
        elif fast is None or rows.pop(fast[0].execution.id, None) is None:
            # Nothing known, or a second write of the attempt: the locked read, at its turn.
            outcomes.append(partial(_fenced_update, cx, lease, change, now_ms))
        else:
            wrote = partial(was_written, fast[0].execution.id)
            outcomes.append(partial(_written_or_fenced, wrote, fast[0], cx, lease, change, now_ms))
    return outcomes


def _raise(exc: Exception) -> Known:
    raise exc


def _written_or_fenced(
    wrote: Callable[[], bool],
    known: Known,
    cx: Cx,
    lease: Lease,
    change: ExecutionChange,
    now_ms: int,
) -> Known:
    """``known`` if its one-statement write went through; otherwise the locked read-modify-write
    (the statement wrote nothing: as if the operation ran here, whole)."""
    if wrote():
        return known
    return _fenced_update(cx, lease, change, now_ms)


class _KnownWrite(NamedTuple):
    """One known-revision write: a row of ``_KNOWN_UPDATES_SQL``, in its columns' order."""

    id: str
    status: str
    data: str
    rev: int
    epoch: int
    token: str
    now_ms: int

    def params(self) -> tuple[Any, ...]:
        """The write as ``_KNOWN_UPDATE_SQL``'s parameters."""
        return (self.status, self.data, self.id, self.rev, self.epoch, self.token, self.now_ms)


def _known_update(
    lease: Lease, change: ExecutionChange, now_ms: int, known: Known | None
) -> tuple[Known, _KnownWrite] | None:
    """The attempt as ``change`` leaves what the holder knows of it, and the write of it at
    the known revision; ``None`` when the holder knows nothing current."""
    if known is None or not _knows(lease, known):
        return None
    after = _kept_identity(known.execution, change(known.execution))
    _check_live(after)
    write = _KnownWrite(after.id, str(after.status), dump(after), known.rev, lease.epoch,
                        lease.token, now_ms)  # fmt: skip
    return Known(lease.token, known.rev + 1, after), write


def _fenced_update(cx: Cx, lease: Lease, change: ExecutionChange, now_ms: int) -> Known:
    before, _, rev = fenced_revision(cx, lease, now_ms)
    after = _kept_identity(before, change(before))
    _check_live(after)
    save_execution(cx, after)
    return Known(lease.token, rev + 1, after)


def _check_live(after: Execution) -> None:
    if not after.status.live:
        raise ValueError(f"update_attempt cannot end an attempt ({after.status}); use finish")


def finish_attempt(
    cx: Cx,
    lease: Lease,
    end: AttemptEnd,
    now_ms: int,
    work_change: WorkChange,
    arm: Sequence[Timer],
    wait: Wait | None,
    publish: Sequence[Event] = (),
) -> Execution:
    settlement = Settlement(end=end, work=work_change, arm=arm, wait=wait, publish=publish)
    return settle_attempt(cx, lease, lambda ex, work: settlement, now_ms)


# ``_KNOWN_UPDATE_SQL``'s fence as a locking read of the attempt, its lease and its Work, in
# that order (the order every writer locks them in): the Work's document, if the attempt row is
# still at the known revision. A row updated meanwhile is rechecked against the whole WHERE.
_KNOWN_SETTLE_SQL = (
    "SELECT w.data FROM conduit_execution e JOIN conduit_work w ON w.id = e.work_id "
    "WHERE e.id = ? AND e.rev = ? AND e.epoch = ? AND e.live = 1 AND e.lease_token = ? "
    "AND e.lease_released = 0 AND e.lease_expires_at_ms > ? FOR UPDATE"
)


def settle_attempt(
    cx: Cx,
    lease: Lease,
    decide: Decision,
    now_ms: int,
    consumed: Sequence[str] = (),
    known: Known | None = None,
) -> Execution:
    """End the attempt ``lease`` holds as ``decide`` says. With ``known`` (what the holder
    last wrote) the attempt's document is not re-read: one statement fences and locks the
    attempt at that revision, its lease and its Work."""
    fast = None
    if _knows(lease, known):
        assert known is not None
        fast = first(cx, _KNOWN_SETTLE_SQL, _known_settle_params(lease, known, now_ms))
    if fast is not None:
        assert known is not None
        return _settle_known(cx, known.execution, fast[0], decide, now_ms, consumed)
    ex = fenced(cx, lease, now_ms)
    # Locked before the consumed inputs are dropped: they change this Work's pending count.
    work = load_work(cx, ex.work_id, lock=True)
    if consumed:
        settle_consumed(cx, ex.id, consumed, now_ms)
        work = load_work(cx, ex.work_id)
    return _settle(cx, ex, work, decide, now_ms)


def _known_settle_params(lease: Lease, known: Known, now_ms: int) -> tuple[Any, ...]:
    return (lease.execution_id, known.rev, lease.epoch, lease.token, now_ms)


def _knows(lease: Lease, known: Known | None) -> bool:
    return known is not None and known.token == lease.token and known.execution.epoch == lease.epoch


def _settle_known(
    cx: Cx, ex: Execution, work_data: str, decide: Decision, now_ms: int, consumed: Sequence[str]
) -> Execution:
    """``settle_attempt`` once the attempt is fenced and locked at the holder's revision, with
    its Work's document as locked."""
    work = Codec.work.decode(work_data)
    if consumed:
        settle_consumed(cx, ex.id, consumed, now_ms)
        work = load_work(cx, ex.work_id)
    return _settle(cx, ex, work, decide, now_ms)


# ``_KNOWN_SETTLE_SQL`` for several attempts in one statement, one array parameter per column
# (``Cx.has_arrays``, in binary as ``_KNOWN_UPDATES_SQL``), locking in attempt id order.
_KNOWN_SETTLES_SQL = (
    "SELECT e.id, w.id, w.data FROM unnest(%b::text[], %b::bigint[], %b::bigint[], %b::text[], "
    "%b::bigint[]) AS v(id, rev, epoch, token, now_ms) "
    "JOIN conduit_execution e ON e.id = v.id JOIN conduit_work w ON w.id = e.work_id "
    "WHERE e.rev = v.rev AND e.epoch = v.epoch AND e.live = 1 AND e.lease_token = v.token "
    "AND e.lease_released = 0 AND e.lease_expires_at_ms > v.now_ms "
    "ORDER BY e.id FOR UPDATE OF e, w"
)


class SettleAhead(NamedTuple):
    """A settlement's fence, read and locked ahead with the others of its batch: the attempt
    was at the holder's revision, live, its lease this one; ``work_data`` is its Work then."""

    work_id: str
    work_data: str


def read_settlements_ahead(
    cx: Cx, calls: Sequence[tuple[Lease, Decision, int, Sequence[str], Known | None]]
) -> list[SettleAhead | None]:
    """The fast read of ``settle_attempt`` for each call (its arguments), all in one round trip:
    one statement from ``ONE_STATEMENT_FROM`` calls, one each (sent together) below; ``None``
    for a call it cannot serve (nothing known, or its attempt has moved on: that settlement
    takes its own path). Only where ``Cx.has_arrays``; the attempts are distinct."""
    ids = [lease.execution_id for lease, *_ in calls]
    assert len(set(ids)) == len(ids), "one read ahead per attempt"
    asked = [
        (lease, known, now_ms)
        for lease, _, now_ms, _, known in calls
        if known is not None and _knows(lease, known)
    ]
    if not cx.has_arrays or not asked:
        return [None] * len(calls)
    found: dict[str, SettleAhead] = {}
    if len(asked) >= ONE_STATEMENT_FROM:
        columns = as_columns(
            (lease.execution_id, known.rev, lease.epoch, lease.token, now_ms)
            for lease, known, now_ms in asked
        )
        found = {
            str(execution_id): SettleAhead(str(work_id), str(data))
            for execution_id, work_id, data in cx.rows(_KNOWN_SETTLES_SQL, columns)
        }
    else:  # in the batch's order: attempt id order, as the one statement locks them
        reads = [
            (lease, known, cx.later(_KNOWN_SETTLE_SQL, _known_settle_params(lease, known, now_ms)))
            for lease, known, now_ms in asked
        ]
        for lease, known, rows in reads:
            row = next(iter(rows()), None)
            if row is not None:
                found[lease.execution_id] = SettleAhead(known.execution.work_id, str(row[0]))
    return [
        found.get(lease.execution_id) if _knows(lease, known) else None
        for lease, _, _, _, known in calls
    ]


def settle_attempt_ahead(
    cx: Cx,
    ahead: SettleAhead,
    lease: Lease,
    decide: Decision,
    now_ms: int,
    consumed: Sequence[str] = (),
    known: Known | None = None,
) -> Execution:
    """``settle_attempt`` from its fence read ahead (``read_settlements_ahead``, in this
    transaction): the attempt and its lease are locked since, and only its own settlement
    writes them; its Work is as read unless this transaction has written it since
    (``Cx.works_written``: another settlement published it an input, say), in which case the
    settlement takes its own path, which reads the row anew."""
    written = cx.works_written
    if known is None or written is None or ahead.work_id in written:
        return settle_attempt(cx, lease, decide, now_ms, consumed, known)
    return _settle_known(cx, known.execution, ahead.work_data, decide, now_ms, consumed)


def _settle(cx: Cx, ex: Execution, work: Work, decide: Decision, now_ms: int) -> Execution:
    """End ``ex`` as ``decide`` says (the caller has established its authority to and locked
    the attempt, then its Work)."""
    settlement = decide(ex, work)
    end = settlement.end
    if end.status.live:
        raise ValueError(f"an attempt ends terminal or parked, not {end.status}")
    if settlement.also is not None:
        ex = _kept_identity(ex, settlement.also(ex))
    ex = msgspec.structs.replace(
        ex,
        status=end.status,
        segments=close_open_segment(ex, now_ms),
        result=end.result,
        failure_code=end.failure_code,
        failure_message=end.failure_message,
        exclusion_confirmed=end.exclusion_confirmed,
        recovery_hold=None,
        remaining_budget_ms=end.remaining_budget_ms,
        ended_at_ms=None if end.status is ExecutionStatus.PARKED else now_ms,
    )
    ex = stage_usage(cx, ex, now_ms)  # budgets: charged at the next start or settle pass
    # The attempt (with its lease) and its Work are locked: their writes may go with those of
    # the batch's other settlements (``Cx.defer``). The attempt's write drops its lease.
    save_execution(cx, ex, locked=True)
    after = changed_work(work, settlement.work(work), now_ms)
    save_work(cx, after, locked=True, was_claimable=is_claimable(work))
    for timer in settlement.arm:
        arm_timer(cx, timer)
    if settlement.wait is not None:
        register_wait(cx, settlement.wait)
    for event in settlement.publish:
        accept_event(cx, event)
    return ex


def get_lease(cx: Cx, execution_id: str) -> Lease | None:
    found = find_lease(cx, execution_id)
    return None if found is None else found[0]


def list_executions(cx: Cx, work_id: str) -> list[Execution]:
    rows = cx.rows(
        "SELECT data FROM conduit_execution WHERE work_id = ? ORDER BY attempt", (work_id,)
    )
    return [Codec.execution.decode(r[0]) for r in rows]


def live_executions(cx: Cx) -> list[Execution]:
    rows = cx.rows("SELECT data FROM conduit_execution WHERE live = 1 ORDER BY id")
    return [Codec.execution.decode(r[0]) for r in rows]


def unconfirmed_exclusions(cx: Cx) -> list[Execution]:
    # Sorted here, not by the SQL: with ``ORDER BY id`` SQLite walks the whole attempt table
    # in id order (every attempt ever finished, read on every pass) instead of the few slot
    # holders its partial index ``conduit_execution_slot`` lists.
    rows = cx.rows(
        "SELECT id, data FROM conduit_execution WHERE holds_slot = 1 AND live = 0"
    )
    return [Codec.execution.decode(data) for _, data in sorted(rows)]


def hold_recovery(cx: Cx, lease: Lease, hold: RecoveryHold, now_ms: int) -> Execution:
    """Keep the attempt unfinished and held; recovery may be claimed again from the hold's
    ``retry_at_ms`` (the released lease reads as expired then)."""
    ex = fenced(cx, lease, now_ms)
    ex = msgspec.structs.replace(ex, status=ExecutionStatus.RECOVERING, recovery_hold=hold)
    save_execution(cx, ex)
    cx.run(
        "UPDATE conduit_execution SET lease_released = 1, lease_expires_at_ms = ? WHERE id = ?",
        (hold.retry_at_ms, ex.id),
    )
    return ex


def held_recoveries(cx: Cx) -> list[Execution]:
    return [ex for ex in live_executions(cx) if ex.recovery_hold is not None]


STOP_CONFIRMED = "core.execution.stop_confirmed"


def confirm_stopped(
    cx: Cx,
    execution_id: str,
    expected_epoch: int,
    now_ms: int,
    by: str | None = None,
    reason: str = "",
    settle: Decision | None = None,
    actor: str | None = None,
) -> Execution:
    ex = load_execution(cx, execution_id, lock=True)
    if by is None:
        # The host's own verified stop.
        if ex.epoch != expected_epoch:
            raise LeaseLostError(
                f"attempt {execution_id}: stop confirmed for epoch {expected_epoch}, "
                f"but it was adopted at epoch {ex.epoch} since"
            )
        ex = msgspec.structs.replace(ex, exclusion_confirmed=True)
        save_execution(cx, ex)
        return ex
    return _confirmed_by_person(cx, ex, expected_epoch, now_ms, by, reason, settle, actor)


def _confirmed_by_person(
    cx: Cx,
    ex: Execution,
    expected_epoch: int,
    now_ms: int,
    by: str,
    reason: str,
    settle: Decision | None,
    actor: str | None = None,
) -> Execution:
    if ex.epoch != expected_epoch:
        raise ConduitError(
            f"attempt {ex.id!r} is at epoch {ex.epoch}, not {expected_epoch}: confirm the stop "
            "for the epoch `conduit work show` reports (nothing was changed)",
            code="epoch_mismatch",
        )
    held = ex.recovery_hold
    if ex.status.terminal and ex.exclusion_confirmed:
        return ex  # confirmed already (a repeated command): nothing to record
    if ex.status.terminal:
        ex = msgspec.structs.replace(ex, exclusion_confirmed=True)
        save_execution(cx, ex)
    elif held is not None and settle is not None:
        ex = _settle(cx, ex, load_work(cx, ex.work_id, lock=True), settle, now_ms)
    else:
        raise ConduitError(
            f"attempt {ex.id!r} is {ex.status} and not held: only a held attempt or an ended "
            "one whose stop is unconfirmed can be confirmed stopped (nothing was changed)",
            code="not_held",
        )
    delivery = f"{STOP_CONFIRMED}/{ex.id}/{ex.epoch}"
    accept_event(
        cx,
        Event(
            id=delivery,
            delivery_id=delivery,
            type=STOP_CONFIRMED,
            payload={
                "work": ex.work_id,
                "execution": ex.id,
                "epoch": ex.epoch,
                "by": by,
                "reason": reason,
                "held": held.code if held is not None else None,
            },
            work_id=ex.work_id,
            scope=ex.scope,
            pending=False,
            accepted_at_ms=now_ms,
            actor=actor,
        ),
    )
    return ex
