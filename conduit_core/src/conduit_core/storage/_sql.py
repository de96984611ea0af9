"""What the SQL operations share: the connection shim, codecs and row writers."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Generic, TypeVar

import msgspec

from conduit_core.errors import NotFoundError, StoreError
from conduit_core.model import (
    MAX_SEGMENTS,
    BudgetLedger,
    ConfigGeneration,
    ControlIntent,
    DaemonRecord,
    Event,
    Execution,
    Hold,
    Invoke,
    Lease,
    Routine,
    Segment,
    Timer,
    Wait,
    Work,
    WorkStatus,
    listed_status,
)
from conduit_core.storage._cx import Cx as Cx
from conduit_core.storage._cx import Row as Row
from conduit_core.storage._cx import SetWrite as SetWrite
from conduit_core.storage._dependents import settle_dependents
from conduit_core.storage._key_parking import park_column, unpark_key
from conduit_core.storage._schema import (
    META_DDL,
    MIGRATIONS,
    SCHEMA_VERSION,
    STORE_KIND,
    PerBackend,
)
from conduit_core.storage._unsafe import unsafe
from conduit_core.validation import AMOUNT_CEILING

T = TypeVar("T")


_encoder = msgspec.json.Encoder()


def dump(record: msgspec.Struct) -> str:
    return _encoder.encode(record).decode()


R = TypeVar("R", bound=msgspec.Struct)


class _Repairing(Generic[R]):
    """A record decoder that reads a float an older release stored as ``null`` (``nan`` and
    ``inf`` encode so) as a safe value, instead of failing every read of the table."""

    def __init__(self, typ: type[R], repairs: dict[str, dict[str, Any]]) -> None:
        self._type = typ
        self._strict = msgspec.json.Decoder(typ)
        self._repairs = repairs

    def decode(self, data: str | bytes) -> R:
        try:
            return self._strict.decode(data)
        except msgspec.ValidationError:
            raw = msgspec.json.decode(data)
            if not isinstance(raw, dict):
                raise
            fixes = {
                key: value
                for name, patch in self._repairs.items()
                if name in raw and raw[name] is None
                for key, value in patch.items()
            }
            if not fixes:
                raise
            return msgspec.convert({**raw, **fixes}, self._type)


class Codec:
    """One reusable decoder per record type."""

    work = msgspec.json.Decoder(Work)
    event = msgspec.json.Decoder(Event)
    execution = msgspec.json.Decoder(Execution)
    timer = msgspec.json.Decoder(Timer)
    hold = msgspec.json.Decoder(Hold)
    wait = msgspec.json.Decoder(Wait)
    control = msgspec.json.Decoder(ControlIntent)
    #: An overflowed ledger reads as exhausted: it refuses its own budget's Work, nothing else.
    ledger = _Repairing(BudgetLedger, {"used": {"used": AMOUNT_CEILING, "exceeded": True}})
    generation = msgspec.json.Decoder(ConfigGeneration)
    daemon = msgspec.json.Decoder(DaemonRecord)
    #: A stored non-finite grace (accepted before issue 17) reads as the default.
    routine = _Repairing(Routine, {"grace_seconds": {"grace_seconds": 60.0}})


#: Whether the event ``e`` is still pending: its own flag, unless it is an input numbered at or
#: below its Work's ``input_floor``. A claim consumes its inputs by raising the floor and writes
#: no input row (schema V15: one row version fewer per job); a control's ``drop`` clears the
#: flag itself.
STILL_PENDING = (
    "(e.pending = 1 AND e.seq > COALESCE("
    "(SELECT w.input_floor FROM conduit_work w WHERE w.id = e.work_id), 0))"
)

#: Events as stored with whether each is still pending (``stored_event`` decodes a row).
EVENTS_READ = f"SELECT e.data, {STILL_PENDING} FROM conduit_event e "


def stored_event(row: Row) -> Event:
    """An ``EVENTS_READ`` row: the event, ``pending`` as the store now has it."""
    event: Event = Codec.event.decode(row[0])
    if event.pending and not row[1]:
        return msgspec.structs.replace(event, pending=False)
    return event


def as_columns(rows: Iterable[tuple[Any, ...]]) -> tuple[list[Any], ...]:
    """Rows of parameters as one list per column: the arrays a set-based statement takes
    (``unnest``, ``Cx.has_arrays``). The rows are all of one length."""
    return tuple(list(column) for column in zip(*rows, strict=True))


#: How many rows (or operations) of a kind go as one set-based statement; fewer go one
#: statement each, in the same round trip. On PostgreSQL a set-based write of 4 rows took the
#: server 0.21 ms, 4 one-row writes 4 x 0.034 ms (``pg_stat_statements``, c = 4); at 64 rows it
#: is 28 us a row against 34, and the client's time per row falls by more. A claim batch's
#: writes set-based from 2 rows ran c = 4 at 546-842 attempts/s against 642-906 from 8
#: (8 alternated runs, 7 in favour of 8).
ONE_STATEMENT_FROM = 8


def write_rows(cx: Cx, write: SetWrite, rows: list[tuple[Any, ...]]) -> None:
    """``write.one`` for each row, in order; from ``ONE_STATEMENT_FROM`` rows, where the
    backend takes arrays, one set-based statement (``write.many``) for them all, so the server
    parses, plans and runs one statement instead of one per row. The rows must be distinct
    (``write.many`` writes each row once)."""
    if not rows:
        return
    if cx.has_arrays and len(rows) >= ONE_STATEMENT_FROM:
        cx.run(write.many, as_columns(rows))
    else:
        cx.many(write.one, rows)


def first(cx: Cx, sql: str, params: tuple[Any, ...] = ()) -> Row | None:
    found = cx.rows(sql, params)
    return found[0] if found else None


# --- Work -----------------------------------------------------------------------------------


def is_claimable(work: Work) -> bool:
    """Whether Work may start by itself now; kept in a column with a partial index.

    Every kind needs pending input, standing Work too: a standing Work is idle (ready, not
    claimable) after an attempt until its next input or a Routine's fire arrives. (It was
    claimable without input and re-ran without pause.)"""
    return (
        work.status is WorkStatus.READY
        and work.retry_timer_id is None
        and work.blocked_reason is None
        and work.pending_inputs > 0
        and (work.dependencies is None or not work.dependencies.waiting_for)
        and work.debounce is None
    )


#: A first input's top-level values kept for search: scalars up to this many characters.
INPUT_VALUE_MAX = 256


def first_input_column(first_input: Event | None) -> str | None:
    """The searchable part of a Work's first input (``input.KEY=VALUE``): the payload's
    top-level scalar values as a JSON object, or ``None`` when it has none."""
    payload = None if first_input is None else first_input.payload
    if not isinstance(payload, dict):
        return None
    # Booleans as text, so both backends' JSON operators give ``true``/``false`` alike.
    kept = {
        k: (("true" if v else "false") if isinstance(v, bool) else v)
        for k, v in payload.items()
        if isinstance(k, str) and isinstance(v, str | int | float | bool)
        and len(str(v)) <= INPUT_VALUE_MAX
    }  # fmt: skip
    return _encoder.encode(kept).decode() if kept else None


#: How much earlier one point of priority makes a Work ready (docs/runtime.md, "Priorities").
PRIORITY_STEP_MS = 60_000


def ready_rank(work: Work) -> int:
    """The Work's place in the ready queue (its ``ready_since`` column): when it last changed,
    a minute earlier per point of priority. One sort key computed when the row is written, so
    a claim stays one scan of the ready index, and a Work of low priority still overtakes
    every later one once it has waited ``PRIORITY_STEP_MS`` per point of difference."""
    return work.updated_at_ms - PRIORITY_STEP_MS * work.priority


def work_params(
    work: Work, first_input: Event | None = None, *, parked: bool = False
) -> tuple[Any, ...]:
    """Column values of a Work row, in table order (also used by bulk loaders); ``parked``:
    claimable, but its key's limit full (``_key_parking``)."""
    return (
        work.id,
        listed_status(work),
        work.scope,
        int(is_claimable(work)),
        ready_rank(work),
        dump(work),
        work.binding,
        work.created_at_ms,
        first_input_column(first_input),
        work.concurrency_key,
        work.key_limit,
        int(parked),
    )


#: The columns ``work_params`` gives, in its order (``created_at_ms`` and ``first_input`` are
#: written once, at insert).
WORK_COLUMNS = (
    "id, status, scope, claimable, ready_since, data, binding, created_at_ms, first_input, "
    "concurrency_key, key_limit, key_parked"
)
#: ``VALUES`` placeholders for one row of ``WORK_COLUMNS``.
WORK_MARKS = "(" + ", ".join("?" for _ in WORK_COLUMNS.split(",")) + ")"


def insert_work(cx: Cx, work: Work, first_input: Event | None = None) -> None:
    cx.run(f"INSERT INTO conduit_work ({WORK_COLUMNS}) VALUES {WORK_MARKS}",
           work_params(work, first_input))  # fmt: skip


def save_work_params(work: Work) -> tuple[Any, ...]:
    # The binding never changes once the Work exists: not rewritten.
    return (*work_params(work)[1:6], work.id)


def _saved_work_params(work: Work) -> tuple[Any, ...]:
    """``SAVE_WORK``'s parameters: ``save_work_params`` with the claimable flag and the rank
    again (the parking's) before the id."""
    p = save_work_params(work)
    return (*p[:-1], p[2], p[3], work.id)


def save_work(
    cx: Cx, work: Work, *, locked: bool = False, was_claimable: bool | None = None
) -> None:
    """Update the Work's row; ``locked``: this transaction has locked it already, so the write
    may be deferred (``Cx.defer``); ``was_claimable``: whether it was in the ready queue
    before this write, when the caller knows (``None``: it may have been).

    A Work that ends (a terminal status) while others wait for it settles them here, in the
    same transaction, whichever operation ended it (``_ops_dependencies.settle_dependents``)."""
    settles = work.has_dependents and work.status.terminal
    if settles:
        work = msgspec.structs.replace(work, has_dependents=False)
    checked = not unsafe("key_check")
    write = SAVE_WORK if checked else _SAVE_WORK_UNPARKED
    if locked:
        cx.defer(write, _saved_work_params(work))
    else:
        cx.run(write.one, _saved_work_params(work))
    if work.concurrency_key is not None and not is_claimable(work) and was_claimable is not False:
        # It may have left the ready queue, and a place of its key with it. A Work that was not
        # in it (a settled attempt's: its attempt's write freed the place and unparked) left none.
        unpark_key(cx, work.concurrency_key)
    if cx.works_written is not None:
        cx.works_written.add(work.id)
    if settles:
        settle_dependents(
            cx, work, Codec.work.decode, lambda w: save_work(cx, w),
            lambda dependent, ended: _record_dependency_failed(cx, dependent, ended),
        )  # fmt: skip


#: The history record of a Work cancelled or held because a dependency did not complete.
DEPENDENCY_FAILED_EVENT = "core.work.dependency_failed"


def _record_dependency_failed(cx: Cx, work: Work, dependency: Work) -> None:
    """An audit event addressed to ``work`` (history, never input), written with the decision."""
    key = f"{DEPENDENCY_FAILED_EVENT}/{work.id}/{dependency.id}"
    policy = work.dependencies.on_failure if work.dependencies is not None else None
    event = Event(
        id=key, delivery_id=key, seq=next_event_seq(cx), type=DEPENDENCY_FAILED_EVENT,
        payload={"work": work.id, "dependency": dependency.id,
                 "dependency_status": str(dependency.status), "policy": str(policy)},
        work_id=work.id, scope=work.scope, pending=False, accepted_at_ms=work.updated_at_ms,
    )  # fmt: skip
    cx.run(
        "INSERT INTO conduit_event (id, delivery_id, seq, work_id, pending, data) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (event.id, event.delivery_id, event.seq, event.work_id, 0, dump(event)),
    )


def _save_work_write(park: str) -> SetWrite:
    return SetWrite(
        "UPDATE conduit_work SET status = ?, scope = ?, claimable = ?, ready_since = ?, "
        f"data = ?, {park.format(new='?', rank='?')} WHERE id = ?",
        "UPDATE conduit_work SET status = v.status, scope = v.scope, claimable = v.claimable, "
        "ready_since = v.ready_since, data = v.data, "
        f"{park.format(new='v.new_claimable', rank='v.new_rank')} "
        "FROM unnest(%b::text[], %b::text[], %b::int[], %b::bigint[], %b::text[], %b::int[], "
        "%b::bigint[], %b::text[]) "
        "AS v(status, scope, claimable, ready_since, data, new_claimable, new_rank, id) "
        "WHERE conduit_work.id = v.id",
    )


#: A Work's row rewritten (``_saved_work_params``), parked if it enters the ready queue while
#: its key's limit is full (``_key_parking.park_column``).
SAVE_WORK = _save_work_write(park_column("{new}", "{rank}"))
#: The same with no Work parked: a race detector's negative control with the key check off
#: (``_unsafe``), where parking would keep the limit in its place.
_SAVE_WORK_UNPARKED = _save_work_write("key_parked = 0 * {new} * {rank}")


def find_work(cx: Cx, work_id: str, *, lock: bool = False) -> Work | None:
    """The Work; ``lock``: also lock its row until commit (every read-modify-write of a Work
    in a write transaction locks it, so concurrent writers never lose each other's change)."""
    sql = _WORK_FOR_UPDATE if lock else "SELECT data FROM conduit_work WHERE id = ?"
    row = first(cx, sql, (work_id,))
    return None if row is None else Codec.work.decode(row[0])


_WORK_FOR_UPDATE = "SELECT data FROM conduit_work WHERE id = ? FOR UPDATE"


def load_work(cx: Cx, work_id: str, *, lock: bool = False) -> Work:
    work = find_work(cx, work_id, lock=lock)
    if work is None:
        raise NotFoundError("work", work_id)
    return work


def changed_work(before: Work, after: Work, now_ms: int) -> Work:
    """A runtime's new Work, with the fields only the store maintains kept."""
    return msgspec.structs.replace(
        after,
        id=before.id,
        last_attempt=before.last_attempt,
        pending_inputs=before.pending_inputs,
        created_at_ms=before.created_at_ms,
        updated_at_ms=now_ms,
        dependencies=before.dependencies,
        has_dependents=before.has_dependents,
    )


# --- Executions and leases ------------------------------------------------------------------


def execution_params(ex: Execution) -> tuple[Any, ...]:
    """Column values of an Execution row, in table order (also used by bulk loaders)."""
    status = ex.status
    live = status.live
    holds_slot = live or (status.terminal and not ex.exclusion_confirmed)
    return (
        ex.id,
        ex.work_id,
        ex.attempt,
        ex.epoch,
        str(status),
        int(live),
        int(holds_slot),
        ex.snapshot.pool,
        ex.scope,
        dump(ex),
        ex.concurrency_key,
    )


#: The columns ``execution_params`` gives, in its order.
EXECUTION_COLUMNS = (
    "id, work_id, attempt, epoch, status, live, holds_slot, pool, scope, data, concurrency_key"
)

#: A new attempt row, at revision 0 (the column's default).
INSERT_EXECUTION_SQL = (
    f"INSERT INTO conduit_execution ({EXECUTION_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


#: New attempt rows, ``execution_params`` each.
INSERT_EXECUTION = SetWrite(
    INSERT_EXECUTION_SQL,
    f"INSERT INTO conduit_execution ({EXECUTION_COLUMNS}) "
    "SELECT * FROM unnest(%b::text[], %b::text[], %b::int[], %b::int[], %b::text[], %b::int[], "
    "%b::int[], %b::text[], %b::text[], %b::text[], %b::text[])",
)


# An attempt's lease lives on its row (schema V14): ``lease_token`` NULL is no lease. A live
# attempt holds one; the write that ends or parks an attempt drops it (``CASE`` without ``ELSE``:
# NULL once ``live`` is 0), so settling an attempt is one row version, not a row and a deleted
# lease row.
SAVE_EXECUTION = SetWrite(
    "UPDATE conduit_execution SET epoch = ?, status = ?, live = ?, holds_slot = ?, data = ?, "
    "rev = rev + 1, lease_token = CASE WHEN ? = 1 THEN lease_token END WHERE id = ?",
    "UPDATE conduit_execution SET epoch = v.epoch, status = v.status, live = v.live, "
    "holds_slot = v.holds_slot, data = v.data, rev = conduit_execution.rev + 1, "
    "lease_token = CASE WHEN v.still_live = 1 THEN conduit_execution.lease_token END "
    "FROM unnest(%b::int[], %b::text[], %b::int[], %b::int[], %b::text[], %b::int[], "
    "%b::text[]) AS v(epoch, status, live, holds_slot, data, still_live, id) "
    "WHERE conduit_execution.id = v.id",
)


def save_execution(cx: Cx, ex: Execution, *, locked: bool = False) -> None:
    """Update the attempt's row, its revision bumped (and its lease dropped if it is no longer
    live); ``locked``: this transaction has locked it already, so the write may be deferred
    (``Cx.defer``)."""
    p = execution_params(ex)
    params = (p[3], p[4], p[5], p[6], p[9], p[5], ex.id)
    if locked:
        cx.defer(SAVE_EXECUTION, params)
    else:
        cx.run(SAVE_EXECUTION.one, params)
    if not p[6]:
        unpark_key(cx, ex.concurrency_key)  # its key's slot may be free


#: The attempt's row and a new lease on it, in one write (a resume, a recovery claim).
SAVE_LEASED_EXECUTION = SetWrite(
    "UPDATE conduit_execution SET epoch = ?, status = ?, live = ?, holds_slot = ?, data = ?, "
    "rev = rev + 1, lease_owner = ?, lease_token = ?, lease_expires_at_ms = ?, "
    "lease_duration_ms = ?, lease_released = 0 WHERE id = ?",
    "UPDATE conduit_execution SET epoch = v.epoch, status = v.status, live = v.live, "
    "holds_slot = v.holds_slot, data = v.data, rev = conduit_execution.rev + 1, "
    "lease_owner = v.owner, lease_token = v.token, lease_expires_at_ms = v.expires_at_ms, "
    "lease_duration_ms = v.duration_ms, lease_released = 0 "
    "FROM unnest(%b::int[], %b::text[], %b::int[], %b::int[], %b::text[], %b::text[], "
    "%b::text[], %b::bigint[], %b::bigint[], %b::text[]) "
    "AS v(epoch, status, live, holds_slot, data, owner, token, expires_at_ms, duration_ms, id) "
    "WHERE conduit_execution.id = v.id",
)


def save_leased_execution(cx: Cx, ex: Execution, lease: Lease, *, locked: bool = False) -> None:
    """``save_execution`` with ``lease`` (of this attempt, at its epoch) as the row's lease."""
    assert lease.execution_id == ex.id, "a lease of this attempt"
    assert lease.epoch == ex.epoch, "a lease at the attempt's epoch"
    p = execution_params(ex)
    params = (p[3], p[4], p[5], p[6], p[9], *lease_params(lease), ex.id)
    if locked:
        cx.defer(SAVE_LEASED_EXECUTION, params)
    else:
        cx.run(SAVE_LEASED_EXECUTION.one, params)


def find_execution(cx: Cx, execution_id: str, *, lock: bool = False) -> Execution | None:
    """The attempt; ``lock``: also lock its row, the attempt's mutex for every writer."""
    sql = "SELECT data FROM conduit_execution WHERE id = ?" + (" FOR UPDATE" if lock else "")
    row = first(cx, sql, (execution_id,))
    return None if row is None else Codec.execution.decode(row[0])


def load_execution(cx: Cx, execution_id: str, *, lock: bool = False) -> Execution:
    ex = find_execution(cx, execution_id, lock=lock)
    if ex is None:
        raise NotFoundError("execution", execution_id)
    return ex


#: A new attempt row holding its first lease: ``execution_params`` then ``lease_params``.
INSERT_LEASED_EXECUTION = SetWrite(
    f"INSERT INTO conduit_execution ({EXECUTION_COLUMNS}, lease_owner, lease_token, "
    "lease_expires_at_ms, lease_duration_ms) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    f"INSERT INTO conduit_execution ({EXECUTION_COLUMNS}, lease_owner, lease_token, "
    "lease_expires_at_ms, lease_duration_ms) "
    "SELECT * FROM unnest(%b::text[], %b::text[], %b::int[], %b::int[], %b::text[], %b::int[], "
    "%b::int[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], "
    "%b::bigint[], %b::bigint[])",
)


def lease_params(lease: Lease) -> tuple[Any, ...]:
    """The lease's columns on its attempt's row (``lease_owner`` … ``lease_duration_ms``)."""
    return (lease.owner, lease.token, lease.expires_at_ms, lease.duration_ms)


#: An attempt's lease as read from its row, in ``lease_of``'s order (select from
#: ``conduit_execution`` with ``lease_token IS NOT NULL``). The lease's epoch is the attempt's:
#: a lease is only ever written with the epoch it was taken at.
LEASE_COLUMNS = (
    "id, work_id, epoch, lease_owner, lease_token, lease_expires_at_ms, lease_duration_ms, "
    "lease_released"
)


def lease_of(row: Row) -> tuple[Lease, bool]:
    """A lease as read (``LEASE_COLUMNS``) and whether it was released."""
    lease = Lease(
        execution_id=row[0],
        work_id=row[1],
        epoch=int(row[2]),
        owner=row[3],
        token=row[4],
        expires_at_ms=int(row[5]),
        duration_ms=int(row[6]),
    )
    return lease, bool(row[7])


def close_open_segment(ex: Execution, now_ms: int) -> list[Segment]:
    segments = list(ex.segments)
    if segments and segments[-1].ended_at_ms is None:
        segments[-1] = msgspec.structs.replace(segments[-1], ended_at_ms=max(now_ms, 0))
    return segments


def with_new_segment(ex: Execution, segment: Segment, now_ms: int) -> Execution:
    """End the open segment and begin ``segment``; keep the last ``MAX_SEGMENTS``."""
    segments = [*close_open_segment(ex, now_ms), segment]
    dropped, dropped_ms = ex.dropped_segments, ex.dropped_active_ms
    while len(segments) > MAX_SEGMENTS:
        old = segments.pop(0)
        dropped += 1
        dropped_ms += max((old.ended_at_ms or old.started_at_ms) - old.started_at_ms, 0)
    return msgspec.structs.replace(
        ex, segments=segments, dropped_segments=dropped, dropped_active_ms=dropped_ms
    )


def first_segment(epoch: int, now_ms: int, wake_event_id: str | None = None) -> Segment:
    return Segment(
        epoch=epoch, started_at_ms=now_ms, invoke=Invoke.PENDING, wake_event_id=wake_event_id
    )


# --- Counters and schema --------------------------------------------------------------------


def next_event_seq(cx: Cx) -> int:
    """The next event sequence number: unique, increasing in the order they are taken. Taken
    under the Work's row lock, so one Work's events commit in ``seq`` order."""
    return next_event_seqs(cx, 1)[0]


def next_event_seqs(cx: Cx, n: int) -> list[int]:
    """``n`` event sequence numbers, increasing, in one statement (see ``next_event_seq``):
    every event of a store is numbered here, from one source per backend."""
    if n <= 0:
        return []
    if cx.has_sequences:
        rows = cx.rows("SELECT nextval('conduit_event_seq') FROM generate_series(1, ?)", (n,))
        return sorted(int(r[0]) for r in rows)
    last = add_to_counter(cx, "event_seq", n)
    return list(range(last - n + 1, last + 1))


#: The order in which a claim locks counter rows: its limits' (``capacity:``), then its
#: concurrency keys' (``key:``), then its budget ledgers' (``budget:``), each set by name.
_LOCK_CLASSES = {"capacity": 0, "key": 1, "budget": 2}


def lock_rank(name: str) -> tuple[int, str]:
    """A counter row's place in the one order every transaction locks them in."""
    return _LOCK_CLASSES.get(name.split(":", 1)[0], len(_LOCK_CLASSES)), name


#: How long a transaction waits for a counter row that comes before one it already holds
#: (``lock_counter_rows``): long enough for a holder that locks in order to commit, far below
#: the server's deadlock check.
OUT_OF_ORDER_WAIT_MS = 50


def lock_counter_rows(cx: Cx, names: Sequence[str]) -> None:
    """Lock the counter rows ``names`` (made at 0 where missing) until commit, in name order.

    Made with ``DO NOTHING`` and locked with ``FOR UPDATE``, not by an upsert that rewrites the
    row: on PostgreSQL an ``ON CONFLICT DO UPDATE`` writes a new version of the row every time,
    a dead tuple per claim batch for vacuum to clean; a row lock writes none. The statements
    are sent without waiting (the lock is taken before anything read after it).

    A transaction waits as long as it takes only for a row that comes after every row it holds
    (``lock_rank``): waits in one order cannot close a circle. A row that comes before one it
    holds is waited for ``OUT_OF_ORDER_WAIT_MS`` at most (``lock_timeout``, which bounds the
    wait for another transaction's insert of the row too); past that the transaction fails
    (``LockNotAvailable``) and the store runs it again, instead of each of two transactions
    waiting for the other until the server's deadlock check (``deadlock_timeout``, 1 s) broke
    one. One claim locks in that order by itself; two claims in one batch (a daemon's pass and
    the claim that joins a settlement) may not: the first took pool p2's limit, the second
    needed p1's, while another daemon's batch had taken p1 and waited for what the first held
    (``tests/storage/test_batch_lock_order.py``)."""
    held = cx.counter_locks
    ordered = sorted(set(names) - held, key=lock_rank)
    last = max(map(lock_rank, held), default=None)
    # ``ordered`` is in rank order: the rows behind what is held come first.
    behind = 0 if last is None else sum(1 for n in ordered if lock_rank(n) < last)
    if behind and cx.locks_rows:
        cx.run(f"SET LOCAL lock_timeout = {OUT_OF_ORDER_WAIT_MS}")
        _lock_rows(cx, ordered[:behind])
        cx.run("SET LOCAL lock_timeout TO DEFAULT")
        _lock_rows(cx, ordered[behind:])
    else:
        _lock_rows(cx, ordered)
    held.update(ordered)


def _lock_rows(cx: Cx, names: Sequence[str]) -> None:
    if not names:
        return
    marks = ", ".join("(?, 0)" for _ in names)
    cx.run(
        f"INSERT INTO conduit_counter (name, value) VALUES {marks} ON CONFLICT (name) DO NOTHING",
        tuple(names),
    )
    cx.run(
        "SELECT name FROM conduit_counter WHERE name IN ("
        + ", ".join("?" for _ in names)
        + ") ORDER BY name FOR UPDATE",
        tuple(names),
    )


def add_to_counter(cx: Cx, name: str, n: int) -> int:
    """Add ``n`` to the counter row ``name`` (created at 0), locked until commit; its new value."""
    row = first(
        cx, "UPDATE conduit_counter SET value = value + ? WHERE name = ? RETURNING value", (n, name)
    )
    if row is not None:
        return int(row[0])
    cx.run("INSERT INTO conduit_counter (name, value) VALUES (?, ?)", (name, n))
    return n


def schema_version(cx: Cx) -> int | None:
    """The stored schema version, or ``None`` when the meta table has none."""
    row = first(cx, "SELECT value FROM conduit_meta WHERE key = 'schema_version'")
    return None if row is None else int(row[0])


def newer_schema_error(url: str, version: int) -> StoreError:
    return StoreError(
        f"store {url} has schema version {version}, newer than this conduit supports "
        f"({SCHEMA_VERSION}); upgrade conduit to open it (nothing was written)",
        code="store_schema_newer",
    )


def migrate(cx: Cx, url: str) -> None:
    """Apply the forward migrations the store lacks, inside the caller's write transaction."""
    cx.run(META_DDL)
    version = schema_version(cx) or 0
    if version > SCHEMA_VERSION:
        raise newer_schema_error(url, version)
    for statements in MIGRATIONS[version:]:
        for statement in statements:
            sql = (
                (statement.postgres if cx.has_sequences else statement.sqlite)
                if isinstance(statement, PerBackend)
                else statement
            )
            if sql is not None:
                cx.run(sql)
    if version < SCHEMA_VERSION:
        upsert_meta(cx, "schema_version", str(SCHEMA_VERSION))
        upsert_meta(cx, "store_kind", STORE_KIND)


def upsert_meta(cx: Cx, key: str, value: str) -> None:
    cx.run(
        "INSERT INTO conduit_meta (key, value) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, value),
    )
