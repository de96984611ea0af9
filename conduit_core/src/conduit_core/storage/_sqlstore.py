"""The Store contract over SQL: each call is one transaction run in a worker thread."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from conduit_core.errors import ConduitError, LeaseLostError
from conduit_core.model import (
    AttemptSnapshot,
    BudgetLedger,
    ConfigGeneration,
    ControlIntent,
    ControlStatus,
    DaemonRecord,
    Event,
    Execution,
    Hold,
    HoldKind,
    Lease,
    RecoveryHold,
    Routine,
    RoutineStatus,
    Timer,
    Wait,
    Work,
    WorkStatus,
)
from conduit_core.storage import _key_parking as parking
from conduit_core.storage import _ops_attempts as att
from conduit_core.storage import _ops_budgets as _budgets
from conduit_core.storage import _ops_bulk as bulk
from conduit_core.storage import _ops_controls as controls
from conduit_core.storage import _ops_daemons as daemons
from conduit_core.storage import _ops_misc as misc
from conduit_core.storage import _ops_routines as rt
from conduit_core.storage import _ops_submit_keys as keyed
from conduit_core.storage import _ops_work as ops
from conduit_core.storage import _ready_reads as ready
from conduit_core.storage._admission import AdmitRequest, BudgetPolicy, GateFilter, PendingUsage
from conduit_core.storage._contract import (
    AttemptEnd,
    Candidate,
    CapacityLimits,
    Claim,
    ClaimRefusal,
    ClaimRequest,
    Decision,
    ExecutionChange,
    KeyWaiting,
    RecoveryRefusal,
    Store,
    WorkChange,
)
from conduit_core.storage._group_commit import GroupCommit, Operation
from conduit_core.storage._keys import key_waiting
from conduit_core.storage._sql import ONE_STATEMENT_FROM, Cx, load_execution, load_work
from conduit_core.storage._submit_key import SubmitKey, Submitted
from conduit_core.storage._threads import StoreThreads
from conduit_core.storage._work_search import WorkQuery, search_work

T = TypeVar("T")
#: Remembered attempts (``SqlStore._known``) beyond this are forgotten at once (all of them).
_KNOWN_MAX = 20_000


class SqlStore(Store):
    """Shared by the SQL backends; a backend supplies ``transaction`` (blocking, retrying)."""

    def __init__(
        self, url: str, *, threads: int, parallel_batches: int = 1, read_threads: int = 0
    ) -> None:
        self.url = url
        #: Where every call runs, at most ``threads`` at once (the store's connections).
        self._threads = StoreThreads(threads, name="conduit-store")
        #: Where reads run when the backend keeps them apart (``read_threads``): a read then
        #: never takes the thread a write batch waits for (SQLite: one writer, one reader).
        self._read_threads = (
            StoreThreads(read_threads, name="conduit-store-read") if read_threads else self._threads
        )
        # Concurrent writes share a transaction (and a disk sync): see _group_commit. Fewer
        # batches in flight make each one larger; serializable batches in parallel conflict.
        #: Per live attempt of this process, its row as last written (``update_attempt``).
        self._known: dict[str, att.Known] = {}
        self._group = GroupCommit(
            self._run_batch, threads=self._threads, max_parallel=parallel_batches
        )

    @abstractmethod
    def transaction(
        self,
        fn: Callable[[Cx], T],
        *,
        write: bool = True,
        shared: bool = False,
        alone: bool = False,
    ) -> T:
        """Run ``fn`` in one transaction, retrying it on contention (blocking). ``shared``: every
        operation in it is row-locked (``ROW_LOCKED``), so it may run beside other writers.
        ``alone``: ``fn`` is one operation, not a batch (see ``Cx.count_or_restart``)."""

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        first_arg = args[0] if args else None
        order = (
            _AFTER_THE_BATCH
            if fn in CLAIMS_FROM_THE_READY_QUEUE
            else _AFTER_THE_CLAIMS
            if fn in AFTER_THE_CLAIMS
            else first_arg.execution_id
            if isinstance(first_arg, Lease)
            else first_arg
            if isinstance(first_arg, str)
            else ""
        )
        in_two_steps = IN_TWO_STEPS.get(fn)
        return await self._group.submit(
            _Call(fn, args),
            shared=fn in ROW_LOCKED,
            order=order,
            savepoint=fn not in FAILS_CLEAN,
            later=None if in_two_steps is None else _TwoSteps(*in_two_steps, args),
            kind="claim" if fn in CLAIMS else "",
            alone_of_kind=fn in CLAIMS_OF_NAMED_WORK,
        )

    def _run_batch(self, ops: list[Operation[Any]]) -> None:
        """Run a batch of writes in one transaction, as if each ran alone, one after another.

        The batch runs first without savepoints. An operation that refuses (raises) after it
        may have written (``op.savepoint``) rolls the whole transaction back, and the batch runs
        again with each such operation under its own ``SAVEPOINT``, so its refusal undoes only
        its own writes (as a retried batch, it reruns every operation against the fresh state).
        The common batch, where nobody refuses, is two statements per operation shorter."""

        if len(ops) == 1:
            # Alone in its transaction: no savepoint (two round trips fewer on a server).
            (op,) = ops
            op.result = op.error = None
            try:
                op.result = self.transaction(op.fn, write=True, shared=op.shared, alone=True)
            except Exception as exc:
                if is_driver_error(exc):
                    raise
                op.error = exc
            return

        shared = all(op.shared for op in ops)
        # Row-locked operations of one batch are concurrent submissions: any order is a valid
        # one, and a sorted one makes two batches lock the attempts they share in one order.
        ordered = sorted(ops, key=lambda op: op.order) if shared else ops
        if any(op.savepoint for op in ordered):
            try:
                self.transaction(partial(_batch, ordered, False), write=True, shared=shared)
                return
            except _Refused:
                pass  # rolled back whole: run it again, each refusal undone by its savepoint
        self.transaction(partial(_batch, ordered, True), write=True, shared=shared)

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        call = partial(self.transaction, partial(_bind, fn, args), write=False)
        return await self._read_threads.run(call)

    async def _read_one(self, fn: Callable[..., T], *args: Any) -> T:
        """A read that is one SELECT: one statement is one snapshot at any isolation level, so
        a backend may run it without a transaction block (see ``read_statement``)."""
        call = partial(self.read_statement, partial(_bind, fn, args))
        return await self._read_threads.run(call)

    def read_statement(self, fn: Callable[[Cx], T]) -> T:
        """Run ``fn``, which issues a single SELECT; by default in a read transaction."""
        return self.transaction(fn, write=False)

    # --- Work and input ----------------------------------------------------------------------

    async def create_work(self, work: Work, *, first_input: Event | None = None) -> Work:
        return await self._write(ops.create_work, work, first_input)

    async def submit_keyed(
        self, work: Work, key: SubmitKey, *, first_input: Event | None = None, now_ms: int
    ) -> Submitted:
        return await self._write(keyed.submit_keyed, work, first_input, key, now_ms)

    async def release_submit_keys(
        self, *, after: tuple[str, str, str] | None, scan: int, now_ms: int
    ) -> tuple[int, tuple[str, str, str] | None]:
        # A read first: an idle sweep takes no write transaction (nor SQLite's one writer).
        rows, going_on = await self._read(keyed.releasable_submit_keys, after, scan, now_ms)
        if not rows:
            return 0, going_on
        return await self._write(keyed.delete_submit_keys, rows), going_on

    async def unpark_keys(self, *, after: str | None, scan: int) -> tuple[int, str | None]:
        # A read first: a sweep that finds no key with room takes no write transaction (nor
        # SQLite's one writer), however many keys have parked Work.
        keys, going_on = await self._read(parking.parked_keys_after, after, scan)
        if not keys:
            return 0, going_on
        return await self._write(parking.unpark_keys, keys), going_on

    async def create_works(
        self, items: Sequence[tuple[Work, Event | None]]
    ) -> list[Work | ConduitError]:
        if not items:
            return []
        return await self._write(bulk.create_works, list(items))

    async def accept_event(self, event: Event) -> Event:
        return await self._write(ops.accept_event, event)

    async def get_event(self, event_id: str) -> Event:
        return await self._read_one(ops.get_event, event_id)

    async def pending_inputs(self, work_id: str) -> list[Event]:
        return await self._read_one(ops.pending_inputs, work_id)

    async def first_pending_inputs(self, work_ids: Sequence[str]) -> dict[str, Event]:
        if not work_ids:
            return {}  # every claim asks, mostly for none: no thread hop, no connection
        return await self._read_one(ops.first_pending_inputs, list(work_ids))

    async def get_work(self, work_id: str) -> Work:
        return await self._read_one(load_work, work_id)

    async def list_work(
        self,
        *,
        status: WorkStatus | None = None,
        scope: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[Work]:
        return await self._read_one(ops.list_work, status, scope, limit, after)

    async def search_work(
        self,
        query: WorkQuery,
        *,
        limit: int = 100,
        after: tuple[int, str] | None = None,
        scan_limit: int = 5_000,
    ) -> tuple[list[Work], tuple[int, str] | None]:
        read = self._read if query.input_key is not None else self._read_one  # two SELECTs
        return await read(search_work, query, limit, after, scan_limit)

    async def update_work(self, work_id: str, change: WorkChange, *, now_ms: int) -> Work:
        return await self._write(ops.update_work, work_id, change, now_ms)

    async def cancel_work(
        self, work_id: str, *, now_ms: int, actor: str | None = None
    ) -> Work:
        return await self._write(ops.cancel_work, work_id, now_ms, actor)

    # --- Claims ------------------------------------------------------------------------------

    async def work_counts(self) -> dict[str, int]:
        return await self._read(ops.work_counts)

    async def ended_work_counts(self) -> dict[str, int]:
        return await self._read(ops.ended_work_counts)

    async def ready_work(self, *, limit: int, after: str | None = None) -> list[Work]:
        return await self._read_one(ops.ready_work, limit, after)

    async def capacity_waiting(self, capacity: CapacityLimits) -> dict[str, int]:
        return await self._read(ops.capacity_waiting, capacity)

    async def ready_depth(self) -> dict[str, int]:
        return await self._read(ops.ready_depth)

    async def ready_summary(self) -> dict[str, tuple[int, int]]:
        return await self._read(ops.ready_summary)

    async def key_waiting(self) -> list[KeyWaiting]:
        return await self._read_one(key_waiting)

    async def capacity_refusal(self, capacity: CapacityLimits, work: Work) -> ClaimRefusal | None:
        return await self._read(ops.capacity_refusal, capacity, work)

    async def claim_attempts(
        self,
        requests: Sequence[ClaimRequest],
        *,
        owner: str,
        now_ms: int,
        lease_ms: int,
        capacity: CapacityLimits | None = None,
    ) -> list[Claim | ClaimRefusal]:
        return self._remember_claims(
            await self._write(ops.claim_attempts, list(requests), owner, now_ms, lease_ms, capacity)
        )

    async def claim_ready(
        self,
        *,
        limit: int,
        snapshot_for: Callable[[Work], AttemptSnapshot | None],
        owner: str,
        now_ms: int,
        lease_ms: int,
        capacity: CapacityLimits | None = None,
    ) -> list[Claim | ClaimRefusal]:
        return self._remember_claims(
            await self._write(
                ready.claim_ready, limit, snapshot_for, owner, now_ms, lease_ms, capacity
            )
        )

    # --- Leases and recovery -----------------------------------------------------------------

    async def renew_lease(self, lease: Lease, *, now_ms: int) -> Lease:
        return await self._write(att.renew_lease, lease, now_ms)

    async def renew_leases(self, leases: Sequence[Lease], *, now_ms: int) -> list[Lease]:
        if not leases:
            return []
        return await self._write(att.renew_leases, list(leases), now_ms)

    async def release_lease(self, lease: Lease, *, now_ms: int) -> None:
        await self._write(att.release_lease, lease, now_ms)

    async def release_leases_of(self, owner: str, *, now_ms: int) -> int:
        return await self._write(att.release_leases_of, owner, now_ms)

    async def expired_attempts(
        self, *, now_ms: int, limit: int = 100, skip_bindings: Sequence[str] = ()
    ) -> list[Execution]:
        return await self._read_one(att.expired_attempts, now_ms, limit, tuple(skip_bindings))

    async def claim_recovery(
        self, execution_id: str, *, owner: str, now_ms: int, lease_ms: int
    ) -> Claim:
        return await self._write(att.claim_recovery, execution_id, owner, now_ms, lease_ms)

    async def claim_recoveries(
        self, execution_ids: Sequence[str], *, owner: str, now_ms: int, lease_ms: int
    ) -> list[Claim | RecoveryRefusal]:
        if not execution_ids:
            return []
        results, revs = await self._write(
            att.claim_recoveries, list(execution_ids), owner, now_ms, lease_ms
        )
        for result in results:
            if isinstance(result, Claim):
                # The adoption's write (the executor's recovery metadata) is then one statement.
                self._remember(
                    att.Known(result.lease.token, revs[result.execution.id], result.execution)
                )
        return results

    async def resume_attempt(
        self,
        execution_id: str,
        *,
        owner: str,
        now_ms: int,
        lease_ms: int,
        wake_event_id: str | None = None,
        capacity: CapacityLimits | None = None,
    ) -> Claim:
        return await self._write(
            att.resume_attempt, execution_id, owner, now_ms, lease_ms, wake_event_id, capacity
        )

    async def adoptable(self, lease: Lease) -> bool:
        return await self._read(att.adoptable, lease)

    # --- Fenced attempt writes ---------------------------------------------------------------

    async def update_attempt(
        self, lease: Lease, change: ExecutionChange, *, now_ms: int
    ) -> Execution:
        known = self._known.get(lease.execution_id)
        try:
            written = await self._write(att.update_attempt, lease, change, now_ms, known)
        except LeaseLostError:
            self._known.pop(lease.execution_id, None)
            raise
        self._remember(written)
        return written.execution

    def _remember(self, known: att.Known) -> None:
        """Keep what a lease holder last wrote, for its next fenced write's fast path. Only
        committed writes are remembered; a stale entry merely misses the fast path."""
        if len(self._known) >= _KNOWN_MAX:
            self._known.clear()
        self._known[known.execution.id] = known

    def _remember_claims(self, claims: list[Claim | ClaimRefusal]) -> list[Claim | ClaimRefusal]:
        """A new attempt's row was inserted at revision 0 with exactly the claimed document."""
        for claim in claims:
            if isinstance(claim, Claim):
                self._remember(att.Known(claim.lease.token, 0, claim.execution))
        return claims

    async def finish_attempt(
        self,
        lease: Lease,
        end: AttemptEnd,
        *,
        now_ms: int,
        work: WorkChange,
        arm: Sequence[Timer] = (),
        wait: Wait | None = None,
        publish: Sequence[Event] = (),
    ) -> Execution:
        self._known.pop(lease.execution_id, None)  # the attempt ends: nothing more to write
        return await self._write(
            att.finish_attempt, lease, end, now_ms, work, list(arm), wait, list(publish)
        )

    async def settle_attempt(
        self, lease: Lease, decide: Decision, *, now_ms: int, consumed: Sequence[str] = ()
    ) -> Execution:
        known = self._known.pop(lease.execution_id, None)  # the attempt ends here
        return await self._write(att.settle_attempt, lease, decide, now_ms, list(consumed), known)

    async def get_execution(self, execution_id: str) -> Execution:
        return await self._read_one(load_execution, execution_id)

    async def list_executions(self, work_id: str) -> list[Execution]:
        return await self._read_one(att.list_executions, work_id)

    async def get_lease(self, execution_id: str) -> Lease | None:
        return await self._read_one(att.get_lease, execution_id)

    async def live_executions(self) -> list[Execution]:
        return await self._read_one(att.live_executions)

    async def unconfirmed_exclusions(self) -> list[Execution]:
        return await self._read_one(att.unconfirmed_exclusions)

    async def hold_recovery(self, lease: Lease, hold: RecoveryHold, *, now_ms: int) -> Execution:
        self._known.pop(lease.execution_id, None)
        return await self._write(att.hold_recovery, lease, hold, now_ms)

    async def held_recoveries(self) -> list[Execution]:
        return await self._read_one(att.held_recoveries)

    async def confirm_stopped(
        self,
        execution_id: str,
        expected_epoch: int,
        *,
        now_ms: int,
        by: str | None = None,
        reason: str = "",
        settle: Decision | None = None,
        actor: str | None = None,
    ) -> Execution:
        return await self._write(
            att.confirm_stopped, execution_id, expected_epoch, now_ms, by, reason, settle, actor
        )

    # --- Timers, holds, waits, controls ------------------------------------------------------

    async def arm_timer(self, timer: Timer) -> None:
        await self._write(misc.arm_timer, timer)

    async def disarm_timer(self, timer_id: str) -> bool:
        return await self._write(misc.disarm_timer, timer_id)

    async def due_timers(self, *, now_ms: int, limit: int = 100) -> list[Timer]:
        return await self._read_one(misc.due_timers, now_ms, limit)

    async def next_timer_due(self) -> int | None:
        return await self._read_one(misc.next_timer_due)

    async def fire_timer(
        self,
        timer_id: str,
        *,
        accept: Event | None = None,
        update_work: WorkChange | None = None,
        now_ms: int = 0,
    ) -> Timer | None:
        return await self._write(misc.fire_timer, timer_id, accept, update_work, now_ms)

    async def put_hold(self, hold: Hold) -> None:
        await self._write(misc.put_hold, hold)

    async def list_holds(self, work_id: str | None = None) -> list[Hold]:
        return await self._read_one(misc.list_holds, work_id)

    async def delete_hold(self, work_id: str, kind: HoldKind, holder: str) -> bool:
        return await self._write(misc.delete_hold, work_id, kind, holder)

    async def register_wait(self, wait: Wait) -> None:
        await self._write(misc.register_wait, wait)

    async def matching_waits(
        self, *, event_type: str | None, correlation_key: str | None
    ) -> list[Wait]:
        return await self._read_one(misc.matching_waits, event_type, correlation_key)

    async def remove_wait(self, execution_id: str) -> bool:
        return await self._write(misc.remove_wait, execution_id)

    async def create_control(self, intent: ControlIntent) -> ControlIntent:
        return await self._write(misc.create_control, intent)

    async def get_control(self, intent_id: str) -> ControlIntent:
        return await self._read_one(misc.get_control, intent_id)

    async def open_controls(self, *, limit: int = 100) -> list[ControlIntent]:
        return await self._read_one(misc.open_controls, limit)

    async def claim_control(self, intent_id: str, *, now_ms: int) -> ControlIntent:
        return await self._write(misc.claim_control, intent_id)

    async def settle_control(
        self, intent_id: str, token: str, status: ControlStatus, *, now_ms: int
    ) -> ControlIntent:
        return await self._write(misc.settle_control, intent_id, token, status, now_ms)

    async def interrupt_work(
        self, work_id: str, intent_id: str, *, now_ms: int, actor: str | None = None
    ) -> ControlIntent:
        return await self._write(controls.interrupt_work, work_id, intent_id, now_ms, actor)

    async def settle_consumed(
        self, execution_id: str, input_ids: Sequence[str], *, now_ms: int
    ) -> list[ControlIntent]:
        return await self._write(controls.settle_consumed, execution_id, list(input_ids), now_ms)

    async def drop_inputs(self, work_id: str, input_ids: Sequence[str]) -> int:
        return await self._write(controls.drop_inputs, work_id, list(input_ids))

    # --- Budgets, config generations, routines -----------------------------------------------

    async def get_ledger(self, key: str) -> BudgetLedger | None:
        return await self._read_one(misc.get_ledger, key)

    async def update_ledger(
        self, key: str, change: Callable[[BudgetLedger | None], BudgetLedger]
    ) -> BudgetLedger:
        return await self._write(misc.update_ledger, key, change)

    async def list_ledgers(self) -> list[BudgetLedger]:
        return await self._read_one(misc.list_ledgers)

    async def record_config_generation(self, digest: str, *, now_ms: int) -> ConfigGeneration:
        return await self._write(misc.record_config_generation, digest, now_ms)

    async def latest_config_generation(self) -> ConfigGeneration | None:
        return await self._read_one(misc.latest_config_generation)

    async def record_daemon(self, daemon: DaemonRecord) -> None:
        await self._write(daemons.record_daemon, daemon)

    async def list_daemons(self) -> list[DaemonRecord]:
        return await self._read_one(daemons.list_daemons)

    async def put_routine(self, routine: Routine) -> None:
        await self._write(misc.put_routine, routine)

    async def get_routine(self, routine_id: str) -> Routine:
        return await self._read_one(misc.get_routine, routine_id)

    async def list_routines(self) -> list[Routine]:
        return await self._read_one(misc.list_routines)

    async def delete_routine(self, routine_id: str) -> bool:
        return await self._write(misc.delete_routine, routine_id)

    # --- Routines: the ledger the ticker drives ----------------------------------------------

    async def create_routine(
        self, routine: Routine, *, bound_work_owner_check: rt.BoundWorkCheck
    ) -> Routine:
        return await self._write(rt.create_routine, routine, bound_work_owner_check)

    async def put_routines(self, routines: Sequence[Routine]) -> None:
        await self._write(rt.put_routines, list(routines))

    async def apply_routine(
        self,
        routine_id: str,
        change: rt.RoutineChange,
        *,
        run: rt.RoutineRun | None = None,
        events: Sequence[Event] = (),
    ) -> Routine:
        return await self._write(rt.apply_routine, routine_id, change, run, list(events))

    async def apply_routines(
        self, updates: Sequence[rt.RoutineUpdate]
    ) -> list[Routine | ConduitError]:
        if not updates:
            return []
        return await self._write(rt.apply_routines, list(updates))

    async def due_pass(self, *, now_ms: int) -> int:
        return await self._write(rt.due_pass, now_ms)

    async def claim_queued(
        self, change: rt.RoutineChange, *, limit: int, due_at_ms: int | None = None
    ) -> list[Routine]:
        return await self._write(rt.claim_queued, change, limit, due_at_ms)

    async def heal_routines(self, heal: Callable[[Routine], Routine | None]) -> list[Routine]:
        return await self._write(rt.heal_routines, heal)

    async def running_routines(self) -> list[Routine]:
        return await self._read(rt.routines_in, (RoutineStatus.CLAIMED, RoutineStatus.RUNNING))

    async def running_fires(
        self, input_id: Callable[[Routine], str | None], *, ids: Sequence[str] | None = None
    ) -> list[tuple[Routine, Work | None, bool]]:
        return await self._read(rt.running_fires, input_id, None if ids is None else list(ids))

    async def next_due_at(self) -> int | None:
        return await self._read(rt.next_due_at)

    async def routine_history(self, routine_id: str, *, limit: int = 50) -> list[rt.RoutineRun]:
        return await self._read(rt.routine_history, routine_id, limit)

    # --- Budgets and gates (admission) -------------------------------------------------------

    async def admission_candidates(
        self,
        *,
        work_ids: Sequence[str],
        snapshot_for: Callable[[Work], AttemptSnapshot | None],
        capacity: CapacityLimits | None = None,
    ) -> list[Candidate]:
        return await self._read(
            _budgets.admission_candidates, list(work_ids), snapshot_for, capacity
        )

    async def admit_attempts(
        self,
        requests: Sequence[AdmitRequest],
        *,
        owner: str,
        now_ms: int,
        lease_ms: int,
        capacity: CapacityLimits | None = None,
        budgets: BudgetPolicy,
        gates: GateFilter | None,
    ) -> list[Claim | ClaimRefusal]:
        return self._remember_claims(await self._write(
            _budgets.admit_attempts, list(requests), owner, now_ms, lease_ms, capacity, budgets,
            gates,
        ))  # fmt: skip

    async def admit_ready(
        self,
        *,
        limit: int,
        snapshot_for: Callable[[Work], AttemptSnapshot | None],
        max_inputs: int | None,
        owner: str,
        now_ms: int,
        lease_ms: int,
        capacity: CapacityLimits | None = None,
        budgets: BudgetPolicy,
        gates: GateFilter | None,
    ) -> tuple[list[Claim | ClaimRefusal], list[Candidate]]:
        outcomes, to_ask = await self._write(
            _budgets.admit_ready, limit, snapshot_for, max_inputs, owner, now_ms, lease_ms,
            capacity, budgets, gates,
        )  # fmt: skip
        return self._remember_claims(outcomes), to_ask

    async def settle_budgets(self, budgets: BudgetPolicy, *, now_ms: int) -> int:
        return await self._write(_budgets.charge_pending, budgets, now_ms)

    async def pending_usage(self) -> list[PendingUsage]:
        return await self._read_one(_budgets.list_pending_usage)

    async def release_budget_hold(
        self, work_id: str, *, reason: str, now_ms: int, actor: str | None = None
    ) -> Work:
        return await self._write(_budgets.release_budget_hold, work_id, reason, now_ms, actor)

    async def settle_gate_hold(
        self, work_id: str, gate: str, *, admit: bool, reason: str, now_ms: int,
        actor: str | None = None,
    ) -> Work:  # fmt: skip
        return await self._write(
            _budgets.settle_gate_hold, work_id, gate, admit, reason, now_ms, actor
        )

    async def work_events(self, work_id: str) -> list[Event]:
        return await self._read_one(_budgets.work_events, work_id)

    async def held_work(self) -> list[tuple[Hold, Work]]:
        return await self._read(_budgets.held_work)


#: Operations that keep their invariants with row locks and constraints alone (each one's lock
#: is named in docs/architecture.md), so a backend with concurrent writers runs them beside each
#: other. Every other write still runs alone (PostgreSQL: the writers' lock taken exclusive).
ROW_LOCKED: frozenset[Callable[..., Any]] = frozenset(
    {
        ops.create_work,
        keyed.submit_keyed,
        keyed.delete_submit_keys,
        bulk.create_works,
        ops.accept_event,
        ops.update_work,
        ops.claim_attempts,
        ready.claim_ready,
        att.renew_lease,
        att.renew_leases,
        att.release_lease,
        att.release_leases_of,
        att.claim_recovery,
        att.claim_recoveries,
        att.update_attempt,
        att.finish_attempt,
        att.settle_attempt,
        att.confirm_stopped,
        rt.apply_routine,
        rt.apply_routines,
        misc.arm_timer,
        misc.disarm_timer,
        misc.fire_timer,
        _budgets.admit_attempts,
        _budgets.admit_ready,
        _budgets.charge_pending,
    }
)


#: Claims from the ready queue run after the other operations of their batch (sorted last): an
#: attempt's settlement batched with them frees its slot for them. They lock their Work rows
#: ``SKIP LOCKED`` (never waiting for another batch's); what they wait for is the limits' rows
#: and then budget ledgers (``_admit_one``'s check; with the limit locked first, staged usage's
#: charge too), as a claim alone in its transaction does. Claims share batches (a daemon's pass
#: and the claim that joins a settlement meet in one often), and each locks the limits of the
#: Work it finds, so a batch's second claim may need a limit that comes before one its first
#: took: that one is waited for only briefly (``_sql.lock_counter_rows``), so two batches never
#: wait for each other until the server's deadlock check (``test_batch_lock_order.py``).
CLAIMS_FROM_THE_READY_QUEUE: frozenset[Callable[..., Any]] = frozenset(
    {ready.claim_ready, _budgets.admit_ready}
)
_AFTER_THE_BATCH = "\U0010ffff"

#: Claims of named Work share their batch with no other claim. A claim of named Work waits for
#: its Work rows (in id order), then its limits' rows; beside another claim in one transaction
#: it would wait for Work rows while holding that claim's limits, or lock two sets of limits in
#: the order they came. A claim of named Work and a claim from the ready queue, each in one
#: pool, deadlocked so with another daemon's batch holding the same two the other way round,
#: which PostgreSQL broke after ``deadlock_timeout`` (1 s) (``test_batch_lock_order.py``).
#: Claims from the ready queue share batches with each other (above): splitting them cost a
#: transaction in sequence (PostgreSQL at 1,000 jobs/s offered: a median 348 jobs/s finished
#: against 431, six alternated pairs).
CLAIMS_OF_NAMED_WORK: frozenset[Callable[..., Any]] = frozenset(
    {ops.claim_attempts, _budgets.admit_attempts}
)
CLAIMS: frozenset[Callable[..., Any]] = CLAIMS_OF_NAMED_WORK | CLAIMS_FROM_THE_READY_QUEUE

#: Operations that lock budget ledgers without a limit's row: they run after the claims of
#: their batch, so that every batch takes limits before ledgers. Run first, a ``charge_pending``
#: held a ledger while its batch's claim waited for a limit another batch held while waiting
#: for that ledger: a deadlock, which PostgreSQL broke after ``deadlock_timeout`` (1 s) by
#: rolling one batch back to be run again (``tests/storage/test_batch_lock_order.py``). (The
#: brief wait of ``lock_counter_rows`` for a row out of order would now end it sooner, with a
#: batch run again all the same: the order avoids it.)
AFTER_THE_CLAIMS: frozenset[Callable[..., Any]] = frozenset({_budgets.charge_pending})
_AFTER_THE_CLAIMS = _AFTER_THE_BATCH * 2


#: Operations that also come in two steps: send the statement, then take the outcome; and the
#: same for several operations of the kind at once (one statement for all). A batch made only
#: of such operations sends every first step, then takes every outcome: one round trip for the
#: batch's statements instead of one per operation, and one statement per kind (``_batch``).
IN_TWO_STEPS: dict[Callable[..., Any], tuple[Callable[..., Any], Callable[..., Any]]] = {
    att.update_attempt: (att.update_attempt_later, att.update_attempts_later),
}


#: Operations whose first read several of a batch may share: ``read(cx, [each one's
#: arguments])`` reads for them all at once and gives each a hint (or ``None``), and
#: ``run(cx, hint, *arguments)`` is the operation from its hint. A batch reads ahead for
#: ``ONE_STATEMENT_FROM`` or more such operations of distinct attempts, and runs them first
#: (``_read_ahead``).
READ_AHEAD: dict[Callable[..., Any], tuple[Callable[..., Any], Callable[..., Any]]] = {
    att.settle_attempt: (att.read_settlements_ahead, att.settle_attempt_ahead),
}


class _Call:
    """An operation: ``fn`` with its arguments, called with the transaction's cursor."""

    __slots__ = ("args", "fn")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn = fn
        self.args = args

    def __call__(self, cx: Cx) -> Any:
        return self.fn(cx, *self.args)


class _TwoSteps:
    """An operation's first step (``one``, called with the cursor: sends, returns the outcome's
    taker), and ``many``: the first steps of several operations of its kind as one call, given
    each one's arguments (see ``IN_TWO_STEPS``)."""

    __slots__ = ("args", "many", "one")

    def __init__(
        self, one: Callable[..., Any], many: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        self.one = one
        self.many = many
        self.args = args

    def __call__(self, cx: Cx) -> Callable[[], Any]:
        taker: Callable[[], Any] = self.one(cx, *self.args)
        return taker


#: Operations that raise only before their first write (every check, then the writes), so in a
#: batch they need no savepoint: a refusal leaves nothing of theirs to roll back.
FAILS_CLEAN: frozenset[Callable[..., Any]] = frozenset(
    {att.update_attempt, att.renew_lease, att.renew_leases}
)


class _Refused(Exception):
    """An operation of a batch run without savepoints refused after it may have written."""


def _batch(ordered: list[Operation[Any]], savepoints: bool, cx: Cx) -> None:
    """Run a batch's operations in order. ``savepoints``: each that may refuse after writing
    runs under its own; without them such a refusal raises ``_Refused`` (roll back, rerun).

    A batch of operations that all come in two steps (``IN_TWO_STEPS``) and need no savepoint
    sends every first step, then takes every outcome: each runs whole where its statement was
    sent, or, if that statement wrote nothing, where its outcome is taken (``update_attempt``).
    """
    if all(op.later is not None and not op.savepoint for op in ordered):
        _batch_in_two_steps(ordered, cx)
        return
    ordered, ahead = _read_ahead(ordered, cx)
    for op in ordered:
        op.result = op.error = None
        savepoint = savepoints and op.savepoint
        if savepoint:
            cx.run("SAVEPOINT conduit_op")
        try:
            hint = ahead.get(id(op))
            op.result = op.fn(cx) if hint is None else hint(cx)
        except Exception as exc:
            if is_driver_error(exc):
                raise  # the transaction's, not the operation's: retry or fail the batch
            if op.savepoint and not savepoints:
                raise _Refused from exc
            if savepoint:
                cx.run("ROLLBACK TO SAVEPOINT conduit_op")
            op.error = exc  # refused before writing anything (FAILS_CLEAN) or rolled back
        if savepoint:
            cx.run("RELEASE SAVEPOINT conduit_op")


def _read_ahead(
    ordered: list[Operation[Any]], cx: Cx
) -> tuple[list[Operation[Any]], dict[int, Callable[[Cx], Any]]]:
    """The batch's order and, per operation read ahead for (by ``id``), how it then runs.

    Operations of one kind in ``READ_AHEAD`` (settlements), each the batch's only operation
    on its attempt, two or more of them, have their first reads sent together (one statement
    from ``ONE_STATEMENT_FROM``, one each below: one round trip either way) and run first, in
    the batch's order: the batch's operations are concurrent
    submissions, so any order is one they could have run in. Running first, each finds its
    attempt as read (only its own operation touches it); its Work may have been written by one
    run before it (an input published to it), which ``Cx.works_written``, tracked from the
    read on, tells it."""
    if not cx.has_arrays:
        return ordered, {}
    attempts: dict[str, int] = {}
    for op in ordered:
        attempts[op.order] = attempts.get(op.order, 0) + 1
    for kind, (read, run) in READ_AHEAD.items():
        group: list[tuple[Operation[Any], _Call]] = [
            (op, op.fn)
            for op in ordered
            if isinstance(op.fn, _Call) and op.fn.fn is kind and attempts[op.order] == 1
        ]
        if len(group) < 2:
            continue
        hints = read(cx, [call.args for _, call in group])
        cx.works_written = set()
        ahead: dict[int, Callable[[Cx], Any]] = {
            id(op): partial(_from_hint, run, hint, call.args)
            for (op, call), hint in zip(group, hints, strict=True)
            if hint is not None
        }
        first = {id(op) for op, _ in group}
        return [op for op, _ in group] + [op for op in ordered if id(op) not in first], ahead
    return ordered, {}


def _from_hint(run: Callable[..., T], hint: Any, args: tuple[Any, ...], cx: Cx) -> T:
    return run(cx, hint, *args)


def _batch_in_two_steps(ordered: list[Operation[Any]], cx: Cx) -> None:
    taken: list[Callable[[], Any] | None] = []
    kinds: dict[Callable[..., Any], list[int]] = {}
    for i, op in enumerate(ordered):
        if isinstance(op.later, _TwoSteps):
            kinds.setdefault(op.later.many, []).append(i)
    together: dict[int, Callable[[], Any]] = {}
    for many, at in kinds.items():
        if len(at) >= ONE_STATEMENT_FROM:  # sent as one (where the kind's first one was)
            takers = many(cx, [ordered[i].later.args for i in at])  # type: ignore[union-attr]
            together.update(zip(at, takers, strict=True))
    for i, op in enumerate(ordered):
        op.result = op.error = None
        assert op.later is not None
        if i in together:
            taken.append(together[i])
            continue
        try:
            taken.append(op.later(cx))
        except Exception as exc:
            if is_driver_error(exc):
                raise
            op.error = exc  # refused before sending anything
            taken.append(None)
    for op, take in zip(ordered, taken, strict=True):
        if take is None:
            continue
        try:
            op.result = take()
        except Exception as exc:
            if is_driver_error(exc):
                raise
            op.error = exc  # refused before writing anything (it needs no savepoint)


def is_driver_error(exc: BaseException) -> bool:
    """An error of the database driver (busy, serialization failure, lost connection)."""
    module = type(exc).__module__
    return module.startswith(("sqlite3", "psycopg", "_sqlite3"))


def _bind(fn: Callable[..., T], args: tuple[Any, ...], cx: Cx) -> T:
    return fn(cx, *args)
