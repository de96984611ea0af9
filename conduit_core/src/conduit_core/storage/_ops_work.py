"""Work, input and claims as synchronous operations inside one transaction."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.model import (
    EXHAUSTED,
    AttemptSnapshot,
    Event,
    Execution,
    ExecutionStatus,
    Lease,
    Work,
    WorkStatus,
)
from conduit_core.storage._contract import (
    JOBS_POOL,
    CapacityLimits,
    Claim,
    ClaimRefusal,
    ClaimRequest,
    WorkChange,
)
from conduit_core.storage._keys import KeyCounts
from conduit_core.storage._ops_dependencies import plan_dependencies
from conduit_core.storage._sql import (
    EVENTS_READ,
    INSERT_LEASED_EXECUTION,
    Codec,
    Cx,
    Row,
    SetWrite,
    changed_work,
    close_open_segment,
    dump,
    execution_params,
    find_work,
    first,
    first_segment,
    insert_work,
    lease_params,
    load_work,
    lock_counter_rows,
    next_event_seq,
    save_execution,
    save_work,
    save_work_params,
    stored_event,
    write_rows,
)
from conduit_core.storage._unsafe import fault, unsafe

# --- Work and input -------------------------------------------------------------------------


def create_work(cx: Cx, work: Work, first_input: Event | None) -> Work:
    if find_work(cx, work.id) is not None:
        raise ConduitError(f"work {work.id!r} already exists", code="work_exists")
    plan = plan_dependencies(cx, [work])
    if plan is not None:
        planned = plan.items[work.id]
        if isinstance(planned, ConduitError):
            raise planned
        work = planned
    insert_work(cx, msgspec.structs.replace(work, pending_inputs=0, last_attempt=0), first_input)
    if plan is not None:
        plan.write(cx)
    if first_input is not None:
        accept_event(cx, msgspec.structs.replace(first_input, work_id=work.id, pending=True))
    return load_work(cx, work.id)


def accept_event(cx: Cx, event: Event) -> Event:
    row = first(cx, EVENTS_READ + "WHERE e.delivery_id = ?", (event.delivery_id,))
    if row is not None:
        return stored_event(row)
    pending = event.pending and event.work_id is not None
    if pending:
        assert event.work_id is not None
        work = load_work(cx, event.work_id, lock=True)
        save_work(cx, msgspec.structs.replace(work, pending_inputs=work.pending_inputs + 1))
    # Numbered after the Work's lock: one Work's input commits in ``seq`` order.
    stored = msgspec.structs.replace(event, seq=next_event_seq(cx), pending=pending)
    cx.run(
        "INSERT INTO conduit_event (id, delivery_id, seq, work_id, pending, data) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (stored.id, stored.delivery_id, stored.seq, stored.work_id, int(pending), dump(stored)),
    )
    return stored


def get_event(cx: Cx, event_id: str) -> Event:
    row = first(cx, EVENTS_READ + "WHERE e.id = ?", (event_id,))
    if row is None:
        raise NotFoundError("event", event_id)
    return stored_event(row)


#: The pending inputs of the Work rows the statement names, oldest first: read from above each
#: Work's ``input_floor`` (schema V14), so a Work's consumed inputs cost the read nothing (and,
#: since V15, a claim consumes them by the floor alone: see ``_sql.STILL_PENDING``).
PENDING_INPUTS_FROM = (
    "SELECT e.data FROM conduit_work w JOIN conduit_event e ON e.work_id = w.id "
    "AND e.seq > w.input_floor WHERE e.pending = 1 AND "
)


def pending_inputs(cx: Cx, work_id: str, limit: int | None = None) -> list[Event]:
    sql = PENDING_INPUTS_FROM + "w.id = ? ORDER BY e.seq"
    params: tuple[Any, ...] = (work_id,)
    if limit is not None:
        sql += " LIMIT ?"
        params += (limit,)
    return [Codec.event.decode(r[0]) for r in cx.rows(sql, params)]


def first_pending_inputs(cx: Cx, work_ids: Sequence[str]) -> dict[str, Event]:
    """Each Work's oldest pending input, for many Work in one query."""
    if not work_ids:
        return {}
    marks = ", ".join("?" for _ in work_ids)
    rows = cx.rows(PENDING_INPUTS_FROM + f"w.id IN ({marks}) ORDER BY e.seq", tuple(work_ids))
    first_of: dict[str, Event] = {}
    for (data,) in rows:
        event = Codec.event.decode(data)
        if event.work_id is not None:
            first_of.setdefault(event.work_id, event)
    return first_of


def list_work(
    cx: Cx, status: WorkStatus | None, scope: str | None, limit: int, after: str | None
) -> list[Work]:
    where, params = ["id > ?"], [after or ""]
    if status is not None:
        where.append("status = ?")
        params.append(str(status))
    if scope is not None:
        where.append("scope = ?")
        params.append(scope)
    sql = f"SELECT data FROM conduit_work WHERE {' AND '.join(where)} ORDER BY id LIMIT ?"
    return [Codec.work.decode(r[0]) for r in cx.rows(sql, (*params, limit))]


def update_work(cx: Cx, work_id: str, change: WorkChange, now_ms: int) -> Work:
    before = load_work(cx, work_id, lock=True)
    after = changed_work(before, change(before), now_ms)
    save_work(cx, after)
    return after


def cancel_work(cx: Cx, work_id: str, now_ms: int, actor: str | None = None) -> Work:
    work = load_work(cx, work_id, lock=True)
    rows = cx.rows(
        "SELECT data FROM conduit_execution WHERE work_id = ? AND (live = 1 OR status = ?)",
        (work_id, str(ExecutionStatus.PARKED)),
    )
    for (data,) in rows:
        ex = Codec.execution.decode(data)
        save_execution(
            cx,
            msgspec.structs.replace(
                ex,
                status=ExecutionStatus.CANCELLED,
                segments=close_open_segment(ex, now_ms),
                recovery_hold=None,  # the stop/confirm pass (or a person) settles it now
                ended_at_ms=now_ms,
            ),
        )
    cx.run("DELETE FROM conduit_wait WHERE work_id = ?", (work_id,))
    cx.run("DELETE FROM conduit_timer WHERE work_id = ?", (work_id,))
    if not work.status.terminal:
        work = msgspec.structs.replace(
            work, status=WorkStatus.CANCELLED, retry_timer_id=None, updated_at_ms=now_ms,
            cancelled_by=actor,
        )
        save_work(cx, work)
    return work


# --- Capacity -------------------------------------------------------------------------------


#: Every slot holder, per pool and scope. On PostgreSQL it must be read with an index scan, never
#: a bitmap scan: see ``_postgres._configure``.
SLOT_COUNT_SQL = (
    "SELECT pool, scope, COUNT(*) FROM conduit_execution WHERE holds_slot = 1 GROUP BY pool, scope"
)


def _counted_already() -> None:
    """``Slots.prepare_later`` with nothing to count afresh."""


class Slots:
    """Slot holders of the limits a transaction claims against, kept current as it claims.

    Capacity (invariant 5) is kept by one row lock per limit: before counting, a claim locks
    the counter row of every limit its attempts count against (their pool or the global limit,
    and each limited scope of their chain), all in one statement in name order. Claims that
    share a limit therefore count one after another, each seeing the others' committed
    attempts (READ COMMITTED: the count is a statement run after the lock was granted); claims
    of unrelated pools and scopes never wait for each other. A slot is freed without these
    locks (a settlement, a confirmed stop): a concurrent count can only be too high for a
    moment, a refusal, never an excess.
    """

    def __init__(
        self,
        cx: Cx,
        limits: CapacityLimits,
        *,
        lock: bool = True,
        before_count: Callable[[], None] | None = None,
    ) -> None:
        self.limits = limits
        #: Run before the slot holders are counted (a batch's deferred claim writes).
        self._before_count = before_count
        self.by_pool: Counter[str | None] = Counter()
        self.by_scope: Counter[str] = Counter()
        self._cx = cx
        # A read transaction only estimates (admission's precheck); SQLite has one writer.
        self._claiming = lock
        self._lock = lock and cx.locks_rows and not unsafe("capacity_lock")
        self._locked: set[str] = set()
        self._counted = False
        #: The concurrency keys' slot holders, locked and counted as the pools' are.
        self.keys = KeyCounts(cx, lock=lock, before_count=before_count)

    def _limit_rows(self, pool: str | None, scope: str) -> list[str]:
        key = self.pool_key(pool)
        names = [f"capacity:pool:{key}"] if key is not None else []
        if key is None and self.limits.global_limit is not None:
            names.append("capacity:global")
        names += [f"capacity:scope:{s}" for s in self.limits.ancestry(scope)
                  if s in self.limits.scope_limits]  # fmt: skip
        return names

    def prepare(self, targets: Iterable[tuple[str | None, str]]) -> None:
        """Lock the limits ``(pool, scope)`` targets count against (once each), then count."""
        self.prepare_later(targets)()

    def prepare_later(self, targets: Iterable[tuple[str | None, str]]) -> Callable[[], None]:
        """``prepare``, sent now and taken in when the returned function is called (a claim
        batch takes it in with its pending input: one round trip for both)."""
        needed = {name for pool, scope in targets for name in self._limit_rows(pool, scope)}
        new = sorted(needed - self._locked)
        if new and self._lock:
            lock_counter_rows(self._cx, new)
        self._locked.update(new)
        # A count taken before a new lock may miss what others committed until it was granted;
        # without locks (SQLite's one writer) a count stays current: this transaction's own
        # claims are taken into it as they are made (``take``).
        if (new and self._lock) or not self._counted:
            return self.count_later()
        return _counted_already

    def count_later(self) -> Callable[[], None]:
        """Count every slot holder afresh (this transaction's own claims included): the count
        is sent now and taken in when the returned function is called."""
        if self._before_count is not None:
            self._before_count()
        rows = self._cx.later(SLOT_COUNT_SQL)

        def take_in() -> None:
            self.by_pool.clear()
            self.by_scope.clear()
            for pool, scope, count in rows():
                self.take(pool, scope, int(count))
            self._counted = True
            if self._claiming:  # a race detector may widen its window here (see _unsafe)
                fault("store.capacity_counted")

        return take_in

    def pool_key(self, pool: str | None) -> str | None:
        # A pool without a limit of its own shares the global limit with pool-less executors.
        return pool if pool is not None and pool in self.limits.pool_limits else None

    def take(self, pool: str | None, scope: str, n: int = 1) -> None:
        self.by_pool[self.pool_key(pool)] += n
        for name in self.limits.ancestry(scope):
            self.by_scope[name] += n

    def refusal(self, work_id: str, pool: str | None, scope: str) -> ClaimRefusal | None:
        if unsafe("capacity_check"):
            return None  # a race detector's negative control (see _unsafe)
        self.prepare([(pool, scope)])
        key = self.pool_key(pool)
        if key is not None:
            limit: int | None = self.limits.pool_limits[key]
            code = "capacity_job_concurrency" if key == JOBS_POOL else "capacity_concurrency"
            name = key
        else:
            limit, code, name = self.limits.global_limit, "capacity_concurrency", "global"
        if limit is not None and self.by_pool[key] >= limit:
            return ClaimRefusal(
                work_id=work_id,
                code=code,
                limit_name=name,
                message=f"pool {name!r} is full ({self.by_pool[key]} of {limit} slots in use)",
            )
        for scope_name in self.limits.ancestry(scope):
            scope_limit = self.limits.scope_limits.get(scope_name)
            if scope_limit is not None and self.by_scope[scope_name] >= scope_limit:
                return ClaimRefusal(
                    work_id=work_id,
                    code="capacity_scope",
                    limit_name=f"scope:{scope_name}",
                    message=f"scope {scope_name!r} is full "
                    f"({self.by_scope[scope_name]} of {scope_limit} slots in use)",
                )
        return None


# --- Claims ---------------------------------------------------------------------------------


def ineligibility(work: Work) -> str | None:
    if work.status is not WorkStatus.READY:
        return f"work {work.id!r} is {work.status}"
    if work.retry_timer_id is not None:
        return f"work {work.id!r} is backing off (retry timer {work.retry_timer_id!r})"
    if work.blocked_reason is not None:
        return f"work {work.id!r} is blocked ({work.blocked_reason})"
    if work.pending_inputs <= 0:
        # Standing Work too: it idles until its next input (see is_claimable).
        return f"work {work.id!r} has no pending input"
    return None


def new_lease(ex: Execution, owner: str, now_ms: int, lease_ms: int) -> Lease:
    return Lease(
        execution_id=ex.id,
        work_id=ex.work_id,
        epoch=ex.epoch,
        owner=owner,
        token=secrets.token_hex(16),
        expires_at_ms=now_ms + lease_ms,
        duration_ms=lease_ms,
    )


def claim_refusal(
    cx: Cx,
    work: Work | None,
    work_id: str,
    pool: str | None,
    slots: Slots | None,
    *,
    rows_checked: bool = False,
) -> ClaimRefusal | None:
    """Why ``work`` cannot start now (ineligible, held, running, or no capacity), or ``None``.

    Capacity is checked, not taken. ``rows_checked``: the caller found no hold and no live
    attempt for it earlier in this transaction and wrote neither since (skips re-reading).
    """
    if work is None:
        return ClaimRefusal(work_id=work_id, code="not_found", message=f"unknown work {work_id!r}")
    if slots is not None and work.binding in slots.limits.skip_bindings:
        return missing_label(work)
    if unsafe("work_exclusion"):  # a race detector's negative control (see _unsafe)
        return None if slots is None else _capacity_or_key(slots, work, pool)
    reason = ineligibility(work)
    if (
        reason is None
        and not rows_checked
        and first(cx, "SELECT 1 FROM conduit_hold WHERE work_id = ?", (work_id,))
    ):
        reason = f"work {work_id!r} is held"
    if reason is None and not rows_checked:
        reason = _slot_holder(cx, work_id)
    if reason is not None:
        return ClaimRefusal(work_id=work_id, code="not_eligible", message=reason)
    if slots is not None:
        return _capacity_or_key(slots, work, pool)
    return None


def missing_label(work: Work) -> ClaimRefusal:
    """The refusal of a claim by a host that lacks a label ``work``'s binding requires."""
    return ClaimRefusal(
        work_id=work.id,
        code="missing_label",
        message=f"work {work.id!r}: this host lacks a label binding {work.binding!r} requires",
    )


def _capacity_or_key(slots: Slots, work: Work, pool: str | None) -> ClaimRefusal | None:
    """The refusal of a full pool or scope, else of a concurrency key at its limit."""
    return slots.refusal(work.id, pool, work.scope) or slots.keys.refusal(work)


def _slot_holder(cx: Cx, work_id: str) -> str | None:
    """Why an attempt of this Work still holding its slot forbids another one, or ``None``.

    Not only a live attempt: one that ended with its exclusion unconfirmed (an unverified stop,
    a failed launch) may still be running, so no replacement starts before its stop is
    confirmed (invariant 6a).
    """
    row = first(
        cx,
        "SELECT id, live FROM conduit_execution WHERE work_id = ? AND holds_slot = 1 "
        "ORDER BY live DESC LIMIT 1",
        (work_id,),
    )
    if row is None:
        return None
    if row[1]:
        return f"work {work_id!r} has a live attempt"
    return (
        f"work {work_id!r} waits for the stop of attempt {row[0]!r} to be confirmed "
        "(its resources may still run)"
    )


#: A claimed Work's row (``SAVE_WORK``), its ``input_floor`` raised to the last input the claim
#: consumed (the second and third parameters after ``save_work_params``: that input's number).
SAVE_CLAIMED_WORK = SetWrite(
    "UPDATE conduit_work SET status = ?, scope = ?, claimable = ?, ready_since = ?, data = ?, "
    "input_floor = CASE WHEN input_floor > ? THEN input_floor ELSE ? END WHERE id = ?",
    "UPDATE conduit_work SET status = v.status, scope = v.scope, claimable = v.claimable, "
    "ready_since = v.ready_since, data = v.data, "
    "input_floor = GREATEST(conduit_work.input_floor, v.floor) "
    "FROM unnest(%b::text[], %b::text[], %b::int[], %b::bigint[], %b::text[], %b::bigint[], "
    "%b::bigint[], %b::text[]) AS v(status, scope, claimable, ready_since, data, floor, "
    "same_floor, id) WHERE conduit_work.id = v.id",
)


def claimed_work_params(work: Work, floor: int) -> tuple[Any, ...]:
    """``SAVE_CLAIMED_WORK``'s parameters: ``save_work_params`` with the floor before the id."""
    return (*save_work_params(work)[:-1], floor, floor, work.id)


def read_inputs_and_slots(
    writes: ClaimWrites,
    work_ids: list[str],
    slots: Slots | None,
    targets: Iterable[tuple[str | None, str]],
    keys: Iterable[str | None] = (),
) -> None:
    """A claim batch's reads once its Work are locked: their pending input, then (with
    ``slots``) every limit the batch may need, locked at once in one order, and counted, then
    its concurrency ``keys`` likewise. All are sent before any is taken in: one round trip, the
    statements run in the order sent."""
    take_inputs = writes.prefetch_later(work_ids)
    counted = slots.prepare_later(targets) if slots is not None else _counted_already
    keys_counted = slots.keys.prepare_later(keys) if slots is not None else _counted_already
    take_inputs(work_ids)
    counted()
    keys_counted()


class ClaimWrites:
    """The writes of a batch of claims, sent at its end as one statement per table (set-based
    over arrays on PostgreSQL, ``write_rows``) instead of four or five round trips per claim.

    Safe because nothing a batch reads after a claim depends on that claim's rows: each claimed
    Work row was locked and read before the batch began, its pending input was read with the
    batch's first claim (``prefetch_later``), and capacity is counted in memory (``Slots.take``)
    except when ``Slots`` counts the slot holders afresh, which flushes the writes first.
    """

    def __init__(self, cx: Cx) -> None:
        self._cx = cx
        self._executions: list[Execution] = []
        self._leases: list[Lease] = []
        self._works: list[Work] = []
        self._floors: list[int] = []  # per claimed Work, the last input consumed (0: none)
        self._pending: dict[str, list[Event]] | None = None

    def prefetch_later(self, work_ids: Sequence[str]) -> Callable[[Iterable[str]], None]:
        """Read the pending input of every Work the batch may claim, in one statement: sent now
        (after the statements that locked those Work rows) and taken in for the Work the batch
        goes on with when the returned function is called."""
        if not work_ids:
            rows: Callable[[], list[Row]] = list
        else:
            marks = ", ".join("?" for _ in work_ids)
            rows = self._cx.later(
                PENDING_INPUTS_FROM + f"w.id IN ({marks}) ORDER BY e.seq", tuple(work_ids)
            )

        def take_in(kept: Iterable[str]) -> None:
            self._pending = {work_id: [] for work_id in kept}
            for (data,) in rows():
                event = Codec.event.decode(data)
                if event.work_id in self._pending:
                    self._pending[event.work_id].append(event)

        return take_in

    def prefetched(self, inputs: dict[str, list[Event]]) -> None:
        """The pending input of every Work the batch may claim, read with their rows."""
        self._pending = inputs

    def pending_inputs(self, work_id: str, limit: int | None) -> list[Event]:
        if self._pending is None or work_id not in self._pending:
            return pending_inputs(self._cx, work_id, limit)
        found = self._pending[work_id]
        return found if limit is None else found[:limit]

    def claimed(self, inputs: list[Event], ex: Execution, lease: Lease, work: Work) -> None:
        self._executions.append(ex)
        self._leases.append(lease)
        self._works.append(work)
        self._floors.append(max((e.seq for e in inputs), default=0))

    def flush(self) -> None:
        """One statement per table for the whole batch (set-based where the backend takes
        arrays: a batch of 64 claims is two statements on PostgreSQL, not 128; the lease goes
        on its attempt's row, and the inputs consumed are those at or below the Work's raised
        ``input_floor``, so no input row is written)."""
        cx = self._cx
        write_rows(
            cx,
            INSERT_LEASED_EXECUTION,
            [
                (*execution_params(e), *lease_params(lease))
                for e, lease in zip(self._executions, self._leases, strict=True)
            ],
        )
        write_rows(
            cx,
            SAVE_CLAIMED_WORK,
            [
                claimed_work_params(w, floor)
                for w, floor in zip(self._works, self._floors, strict=True)
            ],
        )
        if self._works and cx.works_written is not None:
            cx.works_written.update(w.id for w in self._works)
        self._executions, self._leases, self._works = [], [], []
        self._floors = []


def claim_one(
    cx: Cx,
    work: Work | None,
    request: ClaimRequest,
    owner: str,
    now_ms: int,
    lease_ms: int,
    slots: Slots | None,
    *,
    checked: bool = False,
    rows_checked: bool = False,
    writes: ClaimWrites | None = None,
) -> Claim | ClaimRefusal:
    """Claim the next attempt of ``work``. ``checked``: the caller found nothing against it in
    ``claim_refusal`` earlier in this transaction and has taken no slot since (not checked
    twice). ``rows_checked``: as in ``claim_refusal``. ``writes``: the batch's writes, flushed
    by the caller (see ``ClaimWrites``)."""
    work_id = request.work_id
    snapshot: AttemptSnapshot = request.snapshot
    refused = (
        None
        if checked
        else claim_refusal(cx, work, work_id, snapshot.pool, slots, rows_checked=rows_checked)
    )
    if refused is not None or work is None:
        return refused or ClaimRefusal(work_id=work_id, code="not_found", message=work_id)
    batch = writes if writes is not None else ClaimWrites(cx)
    inputs = [
        msgspec.structs.replace(e, pending=False)
        for e in batch.pending_inputs(work_id, request.max_inputs)
    ]
    attempt = work.last_attempt + 1
    ex = Execution(
        id=f"{work_id}#{attempt}",
        work_id=work_id,
        attempt=attempt,
        snapshot=snapshot,
        scope=work.scope,
        inputs=[e.id for e in inputs],
        segments=[first_segment(1, now_ms)],
        started_at_ms=now_ms,
        concurrency_key=work.concurrency_key,
    )
    lease = new_lease(ex, owner, now_ms, lease_ms)
    claimed = msgspec.structs.replace(
        work,
        status=WorkStatus.RUNNING,
        last_attempt=attempt,
        pending_inputs=max(work.pending_inputs - len(inputs), 0),
        updated_at_ms=now_ms,
    )
    if request.update_work is not None:
        claimed = msgspec.structs.replace(
            changed_work(claimed, request.update_work(claimed), now_ms), status=WorkStatus.RUNNING
        )
    batch.claimed(inputs, ex, lease, claimed)
    if writes is None:
        batch.flush()
    if slots is not None:
        slots.take(snapshot.pool, work.scope)
        slots.keys.take(work.concurrency_key)
    return Claim(execution=ex, lease=lease, work=claimed, inputs=inputs)


def claim_attempts(
    cx: Cx,
    requests: Sequence[ClaimRequest],
    owner: str,
    now_ms: int,
    lease_ms: int,
    capacity: CapacityLimits | None,
) -> list[Claim | ClaimRefusal]:
    slots = Slots(cx, capacity) if capacity is not None else None
    if len(requests) > 1 and cx.locks_rows:
        lock_work_rows(cx, [r.work_id for r in requests])
    return [
        claim_one(cx, find_work(cx, r.work_id, lock=True), r, owner, now_ms, lease_ms, slots)
        for r in requests
    ]


def work_rows(cx: Cx, work_ids: Sequence[str]) -> dict[str, tuple[Work, bool, bool]]:
    """Each Work with whether it is held and whether an attempt of it holds its slot, in one
    statement, unlocked (``lock_work_rows`` locks them)."""
    return _work_rows_later(cx, work_ids, "")()


def lock_work_rows(
    cx: Cx, work_ids: Sequence[str], *, skip_locked: bool = False
) -> dict[str, tuple[Work, bool, bool]]:
    """Lock the Work rows in id order (two claimers of the same Work never deadlock); returns
    each row locked with whether it is held and whether an attempt of it still holds its slot
    (live, or ended with its stop unconfirmed; one round trip).
    ``skip_locked``: leave out rows another claim holds. (The two flags come from the
    statement's snapshot; a row is never waited for with ``skip_locked``, and a claim that
    committed first would show in the locked row itself: not ready any more.)"""
    return lock_work_rows_later(cx, work_ids, skip_locked=skip_locked)()


def lock_work_rows_later(
    cx: Cx, work_ids: Sequence[str], *, skip_locked: bool = False
) -> Callable[[], dict[str, tuple[Work, bool, bool]]]:
    """``lock_work_rows``, sent now, its rows taken when the returned function is called."""
    lock = " FOR UPDATE OF w" + (" SKIP LOCKED" if skip_locked else "")
    return _work_rows_later(cx, work_ids, lock)


# The Work with its hold flag and whether an attempt of it holds its slot: not only a live
# attempt, one ended with its stop unconfirmed blocks it too (6a).
def work_rows_select(columns: str = "", source: str = "conduit_work w") -> str:
    """Each Work row of ``source`` (its rows named ``w``) with its hold and slot flags."""
    return (
        "SELECT w.data AS data, "
        "EXISTS (SELECT 1 FROM conduit_hold h WHERE h.work_id = w.id) AS held, "
        "EXISTS (SELECT 1 FROM conduit_execution e WHERE e.work_id = w.id AND e.holds_slot = 1) "
        f"AS live{columns} FROM {source} "
    )


_WORK_ROWS_SQL = work_rows_select()


def _work_rows_later(
    cx: Cx, work_ids: Sequence[str], lock: str
) -> Callable[[], dict[str, tuple[Work, bool, bool]]]:
    ids = sorted(set(work_ids))
    if not ids:
        return dict
    marks = ", ".join("?" for _ in ids)
    rows = cx.later(_WORK_ROWS_SQL + f"WHERE w.id IN ({marks}) ORDER BY w.id" + lock, (*ids,))
    return lambda: decoded_work_rows(rows())


def decoded_work_rows(rows: list[Row]) -> dict[str, tuple[Work, bool, bool]]:
    decoded = [(Codec.work.decode(data), bool(held), bool(live)) for data, held, live in rows]
    return {entry[0].id: entry for entry in decoded}


# Work waiting for an unconfirmed stop is left out, so it never crowds the head of the queue.
UNBLOCKED = (
    "NOT EXISTS (SELECT 1 FROM conduit_execution x "
    "WHERE x.work_id = conduit_work.id AND x.holds_slot = 1)"
)


#: The ready Work per binding and scope: how many, and the oldest ``ready_since``, read from
#: the ready Work's partial index alone (``conduit_work_ready_binding``: an index-only scan, no
#: row's page read; schema V16).
_READY_GROUPS_SQL = (
    "SELECT binding, scope, COUNT(*), MIN(ready_since) FROM conduit_work WHERE claimable = 1 "
    "GROUP BY binding, scope"
)

#: The few ready Work that wait for an unconfirmed stop (``UNBLOCKED``'s), found from the
#: attempts holding a slot (a partial index of its own), to be taken out of the groups.
_BLOCKED_SQL = (
    "SELECT w.binding, w.scope, w.ready_since FROM conduit_work w WHERE w.claimable = 1 "
    "AND w.id IN (SELECT x.work_id FROM conduit_execution x WHERE x.holds_slot = 1)"
)

#: A group's oldest startable Work, where the oldest ready one was blocked: the oldest of its
#: unparked and of its parked Work, each read in order from ``conduit_work_ready_binding``
#: (binding, scope, key_parked, ready_since, id; schema 20).
_OLDEST_STARTABLE_SQL = "SELECT MIN(ready_since) FROM ({} UNION ALL {}) AS oldest".format(*(
    "SELECT * FROM (SELECT ready_since FROM conduit_work WHERE claimable = 1 AND binding = ? "
    f"AND scope = ? AND key_parked = {parked} AND {UNBLOCKED} ORDER BY ready_since LIMIT 1) AS "
    f"parked_{parked}" for parked in (0, 1)
))


def ready_groups(cx: Cx) -> dict[tuple[str, str], tuple[int, int]]:
    """The startable Work per (binding, scope): how many, and the oldest one's ``ready_since``.

    As ``ready_work`` counts them (ready, not waiting for an unconfirmed stop), without reading
    a row per ready Work: the groups come from the index of ready Work, the blocked few from the
    attempts holding a slot (in one read transaction: one snapshot on both stores)."""
    groups = {
        (str(binding), str(scope)): (int(count), int(oldest))
        for binding, scope, count, oldest in cx.rows(_READY_GROUPS_SQL)
    }
    recheck: set[tuple[str, str]] = set()
    for binding, scope, since in cx.rows(_BLOCKED_SQL):
        key = (str(binding), str(scope))
        if key in groups:
            count, oldest = groups[key]
            groups[key] = (count - 1, oldest)
            if int(since) == oldest:
                recheck.add(key)
    for key in recheck:
        found = cx.rows(_OLDEST_STARTABLE_SQL, (*key, *key)) if groups[key][0] > 0 else []
        if found and found[0][0] is not None:
            groups[key] = (groups[key][0], int(found[0][0]))
        else:
            groups[key] = (0, 0)
    return {key: value for key, value in groups.items() if value[0] > 0}


def ready_depth(cx: Cx) -> dict[str, int]:
    depth: Counter[str] = Counter()
    for (binding, _scope), (count, _oldest) in ready_groups(cx).items():
        depth[binding] += count
    return dict(depth)


def ready_summary(cx: Cx) -> dict[str, tuple[int, int]]:
    """Per binding: how many Work could start now, and the oldest one's ``ready_since``."""
    summary: dict[str, tuple[int, int]] = {}
    for (binding, _scope), (count, oldest) in ready_groups(cx).items():
        before = summary.get(binding)
        summary[binding] = (
            (count, oldest) if before is None else (before[0] + count, min(before[1], oldest))
        )
    return summary


def capacity_waiting(cx: Cx, capacity: CapacityLimits) -> dict[str, int]:
    slots = Slots(cx, capacity, lock=False)
    slots.count_later()()
    waiting: Counter[str] = Counter()
    for (binding, scope), (count, _oldest) in ready_groups(cx).items():
        refusal = slots.refusal(binding, capacity.binding_pools.get(binding), scope)
        if refusal is not None:
            waiting[refusal.limit_name or refusal.code] += count
    return dict(waiting)


def capacity_refusal(cx: Cx, capacity: CapacityLimits, work: Work) -> ClaimRefusal | None:
    slots = Slots(cx, capacity, lock=False)
    slots.count_later()()
    return _capacity_or_key(slots, work, capacity.binding_pools.get(work.binding))


#: The listed states of Work that has not ended (``listed_status``), and of Work that has.
OPEN_LISTED = (*(str(s) for s in WorkStatus if not s.terminal), EXHAUSTED)
ENDED_LISTED = tuple(str(s) for s in WorkStatus if s.terminal)


def _listed_counts(cx: Cx, listed: Sequence[str], *, every: bool = False) -> dict[str, int]:
    """Work per listed state (the ``status`` column), every one of ``listed`` present: one
    range of the status index per state, so it reads those states' rows and no others
    (``every``: one pass over every row instead, cheaper when ``listed`` is most of them)."""
    counts = dict.fromkeys(listed, 0)
    if every:
        rows = cx.rows("SELECT status, COUNT(*) FROM conduit_work GROUP BY status")
    else:
        marks = ", ".join("?" for _ in listed)
        rows = cx.rows(
            f"SELECT status, COUNT(*) FROM conduit_work WHERE status IN ({marks}) "
            "GROUP BY status",
            tuple(listed),
        )
    for status, count in rows:
        if str(status) in counts:
            counts[str(status)] = int(count)
    return counts


def work_counts(cx: Cx) -> dict[str, int]:
    """Work per open listed state, and ``startable``: how many ``ready_work`` would return. It
    reads no ended Work (``ended_work_counts`` counts those): its cost follows the Work that
    has not ended, however long the history."""
    counts = _listed_counts(cx, OPEN_LISTED)
    # From the ready Work's index alone, less the few waiting for an unconfirmed stop.
    ready = int(cx.rows("SELECT COUNT(*) FROM conduit_work WHERE claimable = 1")[0][0])
    counts["startable"] = max(ready - len(cx.rows(_BLOCKED_SQL)), 0)
    return counts


def ended_work_counts(cx: Cx) -> dict[str, int]:
    """Ended Work per state (``completed``, ``failed``, ``cancelled``): it reads every ended
    Work's entry in the status index, so its cost grows with the history (``/metrics`` reads
    it seldom; see ``http/_metrics.EndedCounts``). One pass over the whole table: with a long
    history the ended Work are most of it, and a pass took two thirds of the time of a range
    per state (2 million ended Work: 334 against 498 ms on PostgreSQL, 169 against 201 ms on
    SQLite, ``bench/bench_ready_metrics.py``)."""
    return _listed_counts(cx, ENDED_LISTED, every=True)


def ready_work(cx: Cx, limit: int, after: str | None) -> list[Work]:
    """Startable Work, oldest first."""
    if after is None:
        rows = cx.rows(
            f"SELECT data FROM conduit_work WHERE claimable = 1 AND {UNBLOCKED} "
            "ORDER BY ready_since, id LIMIT ?",
            (limit,),
        )
    else:
        rows = cx.rows(
            f"SELECT data FROM conduit_work WHERE claimable = 1 AND id > ? AND {UNBLOCKED} "
            "ORDER BY ready_since, id LIMIT ?",
            (after, limit),
        )
    return [Codec.work.decode(r[0]) for r in rows]
