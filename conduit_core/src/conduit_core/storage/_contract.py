"""The storage contract the runtime uses: domain operations, not a generic ORM.

Every method is async; a backend runs its blocking driver in worker threads and never keeps a
transaction open across an ``await`` of anything but its own driver call. All instants are epoch
milliseconds supplied by the caller (time is injected). Callables passed in (``WorkChange``,
``ExecutionChange``, ``snapshot_for``…) run inside the transaction: they must be pure, fast and
never block or await.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, Self

import msgspec

from conduit_core.errors import ConduitError, LeaseLostError, NotFoundError
from conduit_core.extension import PhaseOutcome, Result
from conduit_core.model import (
    MAX_LAUNCH_PHASES,
    AttemptSnapshot,
    BudgetLedger,
    ConfigGeneration,
    ControlIntent,
    ControlStatus,
    DaemonRecord,
    Event,
    Execution,
    ExecutionStatus,
    Hold,
    HoldKind,
    Invoke,
    LaunchPhase,
    Lease,
    RecoveryHold,
    Routine,
    Timer,
    Wait,
    Work,
    WorkStatus,
)
from conduit_core.storage._admission import AdmitRequest, BudgetPolicy, GateFilter, PendingUsage
from conduit_core.storage._submit_key import SubmitKey, Submitted
from conduit_core.storage._work_search import WorkQuery

if TYPE_CHECKING:
    from conduit_core.storage._routine_records import (
        BoundWorkCheck,
        RoutineChange,
        RoutineRun,
        RoutineUpdate,
    )

__all__ = [
    "AttemptEnd",
    "CapacityLimits",
    "Candidate",
    "Claim",
    "ClaimRefusal",
    "ClaimRequest",
    "Decision",
    "ExecutionChange",
    "NotEligibleError",
    "RecoveryRefusal",
    "Settlement",
    "StaleDispatchError",
    "Store",
    "WorkChange",
]

WorkChange = Callable[[Work], Work]
ExecutionChange = Callable[[Execution], Execution]

#: The pool bounded by ``settings.job_concurrency``; other pools report ``capacity_concurrency``.
JOBS_POOL = "jobs"


class NotEligibleError(ConduitError):
    """A claim refused because the Work cannot start now (terminal, running, held, backoff…)."""

    code = "not_eligible"


class StaleDispatchError(ConduitError):
    """A control settlement whose dispatch token is no longer the live one."""

    code = "stale_dispatch_token"


class CapacityLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Limits checked inside the claim transaction; ``None`` or a missing key means unbounded.

    An attempt counts against its snapshot's pool (``pool_limits``) or, without a pool, against
    ``global_limit``. Scope limits count every pool, for the scope and each of its ancestors
    (``scope_parents`` maps a scope to its parent). Attempts hold a slot while live and after
    they end until their resource exclusion is confirmed.
    """

    global_limit: int | None = None
    pool_limits: dict[str, int] = {}
    scope_limits: dict[str, int] = {}
    scope_parents: dict[str, str] = {}
    #: The pool of each binding's executor (``None``: no pool). With it a claim from the ready
    #: queue reads only the Work of bindings that have a free slot, at most as many rows as
    #: there are free slots; without it (empty) the claim is sized by the free slots overall.
    binding_pools: dict[str, str | None] = {}
    #: Bindings this claimer may not start (it lacks a host label they require): their Work is
    #: never read by its claims from the ready queue, and a claim of one by id is refused
    #: (``missing_label``).
    skip_bindings: tuple[str, ...] = ()
    #: Whether a binding declares a concurrency key: a claim then reads from the ready queue
    #: only Work whose key has room (``_keys.READY_KEY_FILTER``), so a key at its limit never
    #: crowds other keys' Work out of a claim. Keys are enforced whatever this says, wherever
    #: limits are given (a claim with ``capacity=None`` checks no limit, keys neither).
    concurrency_keys: bool = False

    def ancestry(self, scope: str) -> list[str]:
        """``scope`` and its ancestors, nearest first (cycles are cut)."""
        chain = [scope]
        while (parent := self.scope_parents.get(chain[-1])) is not None and parent not in chain:
            chain.append(parent)
        return chain


class ClaimRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Start the next attempt of ``work_id`` pinned to ``snapshot``.

    ``max_inputs`` bounds how many pending inputs (oldest first) the attempt consumes; ``None``
    takes them all. ``update_work`` lets the runtime spend a gate/budget pass in the same commit.
    """

    work_id: str
    snapshot: AttemptSnapshot
    max_inputs: int | None = None
    update_work: WorkChange | None = None


class Claim(msgspec.Struct, frozen=True, kw_only=True):
    """A successful claim: the attempt, its lease, its Work and the input presented to it."""

    execution: Execution
    lease: Lease
    work: Work
    inputs: list[Event] = []


class ClaimRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """A batched claim that did not start; ``code`` is the error code a single claim raises."""

    work_id: str
    code: str
    message: str
    #: For capacity refusals: the pool, ``global`` or ``scope:<id>`` that is full.
    limit_name: str = ""


class KeyWaiting(NamedTuple):
    """A concurrency key at its limit with startable Work held back by it."""

    key: str
    #: The held Work's ``key_limit`` (the largest, should bindings sharing the key differ).
    limit: int
    #: Attempts of the key holding a slot.
    in_use: int
    #: Startable Work with the key, none of which may start until a slot of the key frees.
    waiting: int


class Candidate(NamedTuple):
    """A Work as a dry run of its claim leaves it, for the start gates to be asked about."""

    work: Work
    snapshot: AttemptSnapshot
    #: The refusal eligibility or capacity would give it now (then the gates are not asked).
    refused: ClaimRefusal | None
    #: Its oldest pending input: what the gates see of it.
    first_input: Event | None


class RecoveryRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """A batched recovery claim that was not taken; ``code`` is the error code
    ``claim_recovery`` raises for it (``not_eligible``: finished, or its lease is live;
    ``not_found``)."""

    execution_id: str
    code: str
    message: str


class AttemptEnd(msgspec.Struct, frozen=True, kw_only=True):
    """What the runtime decided about an attempt: a terminal status, or ``parked``."""

    status: ExecutionStatus
    result: Result | None = None
    failure_code: str | None = None
    failure_message: str | None = None
    exclusion_confirmed: bool = False
    remaining_budget_ms: int | None = None


@dataclass(frozen=True, kw_only=True)
class Settlement:
    """Everything one attempt-ending transaction writes, decided on the fresh rows.

    ``also`` changes the attempt before it ends (a buffered launch trail, say).
    """

    end: AttemptEnd
    work: WorkChange
    arm: Sequence[Timer] = ()
    wait: Wait | None = None
    publish: Sequence[Event] = ()
    also: ExecutionChange | None = None


#: Decides an attempt's settlement from the attempt and its Work as read in the transaction.
Decision = Callable[[Execution, Work], Settlement]


class Store(ABC):
    """A durable conduit store. Backends: ``SqliteStore``, ``PostgresStore``; see ``open_store``."""

    #: The store's URL with any password masked (for messages).
    url: str

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections; the store's data stays."""

    async def refresh_statistics(self) -> list[str]:
        """Bring the query planner's statistics up to date where a table outgrew them; returns
        the tables refreshed. A host calls it every few seconds. PostgreSQL: see
        ``_pg_statistics`` (a young store's tables, which autovacuum reaches only after a
        minute). By default nothing: SQLite's planner trusts its indexes without statistics."""
        return []

    # --- Work and input ----------------------------------------------------------------------

    @abstractmethod
    async def create_work(self, work: Work, *, first_input: Event | None = None) -> Work:
        """Store new Work (code ``work_exists`` if the id is taken) with optional first input."""

    @abstractmethod
    async def submit_keyed(
        self, work: Work, key: SubmitKey, *, first_input: Event | None = None, now_ms: int
    ) -> Submitted:
        """Create ``work`` under a dedup or debounce ``key``, or answer with the Work that holds
        the key (``deduplicated``; a debounce adds the input to it and pushes its start).
        Exactly one of any number of racing submitters creates the Work (docs/dedup.md)."""

    @abstractmethod
    async def release_submit_keys(
        self, *, after: tuple[str, str, str] | None, scan: int, now_ms: int
    ) -> tuple[int, tuple[str, str, str] | None]:
        """Delete the dedup and debounce key rows among the next ``scan`` after ``after`` (key
        order) that can name nothing any more: their Work ended and any window it was created
        under has passed. Returns how many were deleted and where to go on (``None``: the end
        of the table). A row a racing submitter points at a new Work is never deleted."""

    @abstractmethod
    async def unpark_keys(self, *, after: str | None, scan: int) -> tuple[int, str | None]:
        """Unpark the oldest parked Work of each of the next ``scan`` concurrency keys with
        parked Work after ``after`` (key order), as far as each key's limit has room: what a
        write racing the parking left parked (docs/runtime.md, "Concurrency keys"). Returns how
        many were unparked and where to go on (``None``: the last key was reached)."""

    @abstractmethod
    async def create_works(
        self, items: Sequence[tuple[Work, Event | None]]
    ) -> list[Work | ConduitError]:
        """``create_work`` for each ``(work, first_input)``, in order, in one transaction (a
        Routine claim pass creates its fires' Work at once). Each result is the Work as stored
        or the ``work_exists`` error of an id already taken (nothing written for that one)."""

    @abstractmethod
    async def accept_event(self, event: Event) -> Event:
        """Accept an Event, assigning its ``seq``; a known ``delivery_id`` returns the stored one.

        A ``pending`` event with a ``work_id`` becomes that Work's input (``NotFoundError`` if the
        Work does not exist).
        """

    @abstractmethod
    async def get_event(self, event_id: str) -> Event: ...

    @abstractmethod
    async def pending_inputs(self, work_id: str) -> list[Event]:
        """The Work's input not yet presented to an attempt, in acceptance order."""

    @abstractmethod
    async def first_pending_inputs(self, work_ids: Sequence[str]) -> dict[str, Event]:
        """Each listed Work's oldest pending input (Work without any are left out), one read."""

    @abstractmethod
    async def get_work(self, work_id: str) -> Work: ...

    @abstractmethod
    async def list_work(
        self,
        *,
        status: WorkStatus | None = None,
        scope: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[Work]:
        """Work ordered by id, after the id ``after`` (keyset pagination)."""

    @abstractmethod
    async def search_work(
        self,
        query: WorkQuery,
        *,
        limit: int = 100,
        after: tuple[int, str] | None = None,
        scan_limit: int = 5_000,
    ) -> tuple[list[Work], tuple[int, str] | None]:
        """Work matching ``query`` ordered by (created time, id), after the cursor ``after``,
        and the cursor of the next page (``None``: the last). See ``_work_search``."""

    @abstractmethod
    async def update_work(self, work_id: str, change: WorkChange, *, now_ms: int) -> Work:
        """Apply a runtime decision (manual retry, clearing a backoff…) to the stored Work."""

    @abstractmethod
    async def cancel_work(
        self, work_id: str, *, now_ms: int, actor: str | None = None
    ) -> Work:
        """Cancel Work: fence its unfinished attempts (keeping their resource holds), remove its
        waits and timers (``actor``, the token's name, is kept as ``cancelled_by``). Physical
        cleanup is the caller's, after this commit."""

    # --- Claims ------------------------------------------------------------------------------

    @abstractmethod
    async def ready_work(self, *, limit: int, after: str | None = None) -> list[Work]:
        """Work that could start now (ready, no backoff or hold, has input), oldest first."""

    @abstractmethod
    async def capacity_waiting(self, capacity: CapacityLimits) -> dict[str, int]:
        """How many startable Work wait for each full limit now (``global``, a pool's name,
        ``scope:<id>``), from the slot holders and the ready Work per binding and scope: two
        grouped reads of partial indexes, never a claim that fails."""

    @abstractmethod
    async def key_waiting(self) -> list[KeyWaiting]:
        """The concurrency keys at their limit with startable Work waiting for them, most
        waiting first: one grouped read of the startable keyed Work (a partial index), each
        key's slot holders counted in the same statement (never a read per Work)."""

    @abstractmethod
    async def ready_depth(self) -> dict[str, int]:
        """How many Work could start now, per binding (bindings with none left out): one
        grouped read of the ready Work's partial index, never a scan of every Work."""

    @abstractmethod
    async def ready_summary(self) -> dict[str, tuple[int, int]]:
        """Per binding with startable Work: ``(how many, the oldest one's ready-since ms)``
        (ready since its last change: its submit, input, or the retry that made it ready),
        read like :meth:`ready_depth` from the ready Work's partial index."""

    @abstractmethod
    async def capacity_refusal(self, capacity: CapacityLimits, work: Work) -> ClaimRefusal | None:
        """Why ``work`` could not start now for capacity (its pool or a scope of its chain is
        full), or ``None``; the slot holders are counted, nothing is locked."""

    @abstractmethod
    async def claim_attempts(
        self,
        requests: Sequence[ClaimRequest],
        *,
        owner: str,
        now_ms: int,
        lease_ms: int,
        capacity: CapacityLimits | None = None,
    ) -> list[Claim | ClaimRefusal]:
        """Claim several attempts in one transaction, rechecking eligibility and capacity for each.

        Each claim takes the Work's next attempt number, creates the Execution at epoch 1 with its
        snapshot, a lease, consumes the selected pending input and begins segment 1 (invoke
        pending). Results are in request order.
        """

    async def claim_attempt(
        self,
        request: ClaimRequest,
        *,
        owner: str,
        now_ms: int,
        lease_ms: int,
        capacity: CapacityLimits | None = None,
    ) -> Claim:
        """Claim one attempt or raise ``NotEligibleError``/``CapacityError``/``NotFoundError``."""
        (outcome,) = await self.claim_attempts(
            [request], owner=owner, now_ms=now_ms, lease_ms=lease_ms, capacity=capacity
        )
        if isinstance(outcome, Claim):
            return outcome
        raise refusal_error(outcome)

    @abstractmethod
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
        """Pick up to ``limit`` ready Work and claim them in one transaction.

        ``snapshot_for`` pins each attempt (``None`` skips that Work). Capacity refusals are
        returned; the batch goes on with the next Work, which may fit another pool.
        """

    # --- Leases and recovery -----------------------------------------------------------------

    @abstractmethod
    async def renew_lease(self, lease: Lease, *, now_ms: int) -> Lease:
        """Extend to ``max(stored expiry, now + duration)``: a renewal never shortens a lease.

        Raises ``LeaseLostError`` after expiry, release, cancellation or a newer epoch.
        """

    async def renew_leases(self, leases: Sequence[Lease], *, now_ms: int) -> list[Lease]:
        """``renew_lease`` for many leases (a host's lease keeper renews all it holds at once).

        Returns the renewed ones; a lease ``renew_lease`` would refuse is left out (lost). An
        error raised means nothing is known (a store outage): the caller retries. The default
        renews one by one; a backend does it in one transaction.
        """
        renewed: list[Lease] = []
        for lease in leases:
            try:
                renewed.append(await self.renew_lease(lease, now_ms=now_ms))
            except LeaseLostError:
                continue
        return renewed

    @abstractmethod
    async def release_lease(self, lease: Lease, *, now_ms: int) -> None:
        """Give the lease up: the same attempt becomes recoverable at once."""

    @abstractmethod
    async def release_leases_of(self, owner: str, *, now_ms: int) -> int:
        """Release every lease ``owner`` holds, in one transaction, as ``release_lease`` would
        each; returns how many. For a host that knows ``owner`` is dead (its own predecessor,
        see docs/daemon.md): its attempts become recoverable at once, and any write of the
        dead owner is refused from then on. Leases of other owners are untouched."""

    @abstractmethod
    async def expired_attempts(
        self, *, now_ms: int, limit: int = 100, skip_bindings: Sequence[str] = ()
    ) -> list[Execution]:
        """Unfinished, unparked attempts whose lease expired or was released, the earliest
        expired first, none pinned to a binding of ``skip_bindings``."""

    @abstractmethod
    async def claim_recovery(
        self, execution_id: str, *, owner: str, now_ms: int, lease_ms: int
    ) -> Claim:
        """Take over an expired/released attempt at epoch + 1 with status ``recovering``.

        Ends the open segment and begins a ``recovered`` one at the same instant. The old holder's
        writes are refused from then on. ``NotEligibleError`` if its lease is still live or it
        has finished. A held attempt (``recovery_hold``) is claimed again at the same epoch,
        in the same segment, with a new lease token.
        """

    async def claim_recoveries(
        self, execution_ids: Sequence[str], *, owner: str, now_ms: int, lease_ms: int
    ) -> list[Claim | RecoveryRefusal]:
        """``claim_recovery`` for many attempts at once: one entry per distinct id, in the order
        given, each a ``Claim`` or the ``RecoveryRefusal`` that ``claim_recovery`` would have
        raised. Each claim keeps ``claim_recovery``'s every rule (epoch + 1 and a recovered
        segment, or a held recovery's same epoch with a new token). An error raised means
        nothing is known (a store outage): the caller retries. The default claims one by one;
        a backend does it set-based in one transaction.
        """
        out: list[Claim | RecoveryRefusal] = []
        for execution_id in dict.fromkeys(execution_ids):
            try:
                out.append(
                    await self.claim_recovery(
                        execution_id, owner=owner, now_ms=now_ms, lease_ms=lease_ms
                    )
                )
            except (NotEligibleError, NotFoundError) as exc:
                out.append(
                    RecoveryRefusal(execution_id=execution_id, code=exc.code, message=exc.message)
                )
        return out

    @abstractmethod
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
        """Resume a parked attempt at epoch + 1 (status ``resuming``, a new pending segment)."""

    @abstractmethod
    async def adoptable(self, lease: Lease) -> bool:
        """Whether the attempt still belongs to recovery: unfinished, Work open, epoch ≥ lease's."""

    # --- Fenced attempt writes ---------------------------------------------------------------

    @abstractmethod
    async def update_attempt(
        self, lease: Lease, change: ExecutionChange, *, now_ms: int
    ) -> Execution:
        """Apply ``change`` to the attempt, fenced by (execution, epoch, token) and expiry.

        Identity fields (id, work, attempt, epoch) are kept; raises ``LeaseLostError``.
        """

    @abstractmethod
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
        """End or park the attempt, update its Work, arm timers, register a wait and accept the
        ``publish`` events (idempotent by delivery id), atomically.

        Fenced like ``update_attempt``. The open segment ends at ``now_ms``; the lease is gone.
        """

    async def begin_launch_phase(self, lease: Lease, name: str, *, now_ms: int) -> Execution:
        """Record a launch phase of the open segment as begun."""

        def change(ex: Execution) -> Execution:
            def seg(s: Any) -> Any:
                launch = [*s.launch, LaunchPhase(name=name, started_at_ms=now_ms)]
                return msgspec.structs.replace(s, launch=launch[-MAX_LAUNCH_PHASES:])

            return _with_open_segment(ex, seg)

        return await self.update_attempt(lease, change, now_ms=now_ms)

    async def end_launch_phase(
        self, lease: Lease, name: str, outcome: PhaseOutcome, *, now_ms: int
    ) -> Execution:
        """Record the latest open phase called ``name`` as ended with ``outcome``."""

        def change(ex: Execution) -> Execution:
            def seg(s: Any) -> Any:
                launch = list(s.launch)
                for i in range(len(launch) - 1, -1, -1):
                    if launch[i].name == name and launch[i].ended_at_ms is None:
                        launch[i] = msgspec.structs.replace(
                            launch[i], ended_at_ms=now_ms, outcome=outcome
                        )
                        break
                return msgspec.structs.replace(s, launch=launch)

            return _with_open_segment(ex, seg)

        return await self.update_attempt(lease, change, now_ms=now_ms)

    async def mark_invoked(self, lease: Lease, *, isolated: bool, now_ms: int) -> Execution:
        """The fenced write just before the executor is called."""
        return await self.update_attempt(
            lease,
            lambda ex: _with_open_segment(
                ex, lambda s: msgspec.structs.replace(s, invoke=Invoke.CALLED, isolated=isolated)
            ),
            now_ms=now_ms,
        )

    async def pin_segment(self, lease: Lease, pin: str, *, now_ms: int) -> Execution:
        """Pin the sandbox/container digest to the open segment."""
        return await self.update_attempt(
            lease,
            lambda ex: _with_open_segment(ex, lambda s: msgspec.structs.replace(s, pin=pin)),
            now_ms=now_ms,
        )

    async def persist_recovery(
        self, lease: Lease, metadata: dict[str, Any], *, now_ms: int
    ) -> Execution:
        """Store the executor's opaque recovery metadata."""
        return await self.update_attempt(
            lease, lambda ex: msgspec.structs.replace(ex, recovery=metadata), now_ms=now_ms
        )

    async def set_attempt_status(
        self, lease: Lease, status: ExecutionStatus, *, now_ms: int
    ) -> Execution:
        """Move a live attempt between live statuses (launching → running, recovering → …)."""
        if not status.live:
            raise ValueError(f"{status} is not a live status; use finish_attempt")
        return await self.update_attempt(
            lease, lambda ex: msgspec.structs.replace(ex, status=status), now_ms=now_ms
        )

    @abstractmethod
    async def settle_attempt(
        self, lease: Lease, decide: Decision, *, now_ms: int, consumed: Sequence[str] = ()
    ) -> Execution:
        """Like ``finish_attempt``, with the settlement decided inside the transaction from the
        freshly read attempt and Work (``decide`` must be pure and quick). ``consumed`` input
        ids settle their inject intents and leave the pending queue first, in the same
        transaction (see ``settle_consumed``)."""

    @abstractmethod
    async def get_execution(self, execution_id: str) -> Execution: ...

    @abstractmethod
    async def list_executions(self, work_id: str) -> list[Execution]:
        """The Work's attempts by attempt number."""

    @abstractmethod
    async def get_lease(self, execution_id: str) -> Lease | None:
        """The attempt's current lease, released or expired included; ``None`` once finished."""

    @abstractmethod
    async def live_executions(self) -> list[Execution]:
        """Unfinished, unparked attempts."""

    @abstractmethod
    async def unconfirmed_exclusions(self) -> list[Execution]:
        """Ended attempts whose resource exclusion is not confirmed yet (they hold capacity)."""

    @abstractmethod
    async def hold_recovery(self, lease: Lease, hold: RecoveryHold, *, now_ms: int) -> Execution:
        """Hold a recovering attempt that could not be settled: it stays unfinished (slot kept,
        no new attempt of its Work) with ``hold`` recorded, and the lease is released to expire
        at ``hold.retry_at_ms``, when recovery is claimed again. Fenced by ``lease``."""

    @abstractmethod
    async def held_recoveries(self) -> list[Execution]:
        """Unfinished attempts whose recovery is held."""

    @abstractmethod
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
        """Record that the attempt's resources stopped.

        Without ``by`` it is the host's verified stop of an ended attempt: ``LeaseLostError`` if
        it was adopted at another epoch since. With ``by`` it is a person's audited
        confirmation (event ``core.execution.stop_confirmed``): refused with ``epoch_mismatch``
        for another epoch and ``not_held`` for an attempt neither held nor ended unconfirmed;
        a held attempt is ended as ``settle`` decides (required then); an ended one gets its
        exclusion confirmed; an already confirmed one is returned unchanged.
        """

    # --- Timers ------------------------------------------------------------------------------

    @abstractmethod
    async def arm_timer(self, timer: Timer) -> None:
        """Store (or replace) a durable timer."""

    @abstractmethod
    async def disarm_timer(self, timer_id: str) -> bool: ...

    @abstractmethod
    async def due_timers(self, *, now_ms: int, limit: int = 100) -> list[Timer]: ...

    @abstractmethod
    async def next_timer_due(self) -> int | None:
        """When the earliest armed timer is due (epoch ms), ``None`` when none is armed."""

    @abstractmethod
    async def fire_timer(
        self,
        timer_id: str,
        *,
        accept: Event | None = None,
        update_work: WorkChange | None = None,
        now_ms: int = 0,
    ) -> Timer | None:
        """Remove the timer and return it if this caller fired it; ``None`` if someone else did.

        ``accept`` (an Event) and ``update_work`` (applied to the timer's Work) join the same
        transaction, only when this caller fires it.
        """

    # --- Holds, waits, controls --------------------------------------------------------------

    @abstractmethod
    async def put_hold(self, hold: Hold) -> None:
        """Hold the Work's next start (a ready Work becomes ``held``)."""

    @abstractmethod
    async def list_holds(self, work_id: str | None = None) -> list[Hold]: ...

    @abstractmethod
    async def delete_hold(self, work_id: str, kind: HoldKind, holder: str) -> bool:
        """Remove a hold; the last one's removal makes ``held`` Work ``ready`` again."""

    @abstractmethod
    async def register_wait(self, wait: Wait) -> None: ...

    @abstractmethod
    async def matching_waits(
        self, *, event_type: str | None, correlation_key: str | None
    ) -> list[Wait]:
        """Waits for this event type (or any type) and this key (or any key)."""

    @abstractmethod
    async def remove_wait(self, execution_id: str) -> bool: ...

    @abstractmethod
    async def create_control(self, intent: ControlIntent) -> ControlIntent: ...

    @abstractmethod
    async def get_control(self, intent_id: str) -> ControlIntent: ...

    @abstractmethod
    async def open_controls(self, *, limit: int = 100) -> list[ControlIntent]:
        """Intents pending or being dispatched, oldest first."""

    @abstractmethod
    async def claim_control(self, intent_id: str, *, now_ms: int) -> ControlIntent:
        """Mark an open intent dispatching under a fresh token (the previous token goes stale)."""

    @abstractmethod
    async def settle_control(
        self, intent_id: str, token: str, status: ControlStatus, *, now_ms: int
    ) -> ControlIntent:
        """Settle with the live token only; ``StaleDispatchError`` otherwise."""

    @abstractmethod
    async def interrupt_work(
        self, work_id: str, intent_id: str, *, now_ms: int, actor: str | None = None
    ) -> ControlIntent:
        """Fence the Work's live attempt (keeping its resource hold), leave the Work ready and
        record an interrupt intent for it; ``NotEligibleError`` when nothing runs."""

    @abstractmethod
    async def settle_consumed(
        self, execution_id: str, input_ids: Sequence[str], *, now_ms: int
    ) -> list[ControlIntent]:
        """Settle the attempt's open inject intents for these consumed inputs as consumed,
        whatever their dispatch state, and take the inputs out of the pending queue."""

    @abstractmethod
    async def drop_inputs(self, work_id: str, input_ids: Sequence[str]) -> int:
        """Take inputs out of the Work's pending queue (a control's ``drop`` fallback)."""

    # --- Budgets, config generations, routines -----------------------------------------------

    @abstractmethod
    async def get_ledger(self, key: str) -> BudgetLedger | None: ...

    @abstractmethod
    async def update_ledger(
        self, key: str, change: Callable[[BudgetLedger | None], BudgetLedger]
    ) -> BudgetLedger:
        """Read-modify-write one ledger in a transaction."""

    @abstractmethod
    async def list_ledgers(self) -> list[BudgetLedger]: ...

    @abstractmethod
    async def record_config_generation(self, digest: str, *, now_ms: int) -> ConfigGeneration:
        """The generation for this config digest: the known one, or the next number."""

    @abstractmethod
    async def latest_config_generation(self) -> ConfigGeneration | None: ...

    # --- The daemon registry ------------------------------------------------------------------

    @abstractmethod
    async def record_daemon(self, daemon: DaemonRecord) -> None:
        """Insert or replace the registry row of ``daemon.id`` (its start, heartbeat or exit);
        rows not written for a week are dropped."""

    @abstractmethod
    async def list_daemons(self) -> list[DaemonRecord]:
        """Every daemon in the registry, by id, as last written (``lost`` is the reader's call,
        from ``last_seen_ms``)."""

    @abstractmethod
    async def put_routine(self, routine: Routine) -> None: ...

    @abstractmethod
    async def get_routine(self, routine_id: str) -> Routine: ...

    @abstractmethod
    async def list_routines(self) -> list[Routine]: ...

    @abstractmethod
    async def delete_routine(self, routine_id: str) -> bool: ...

    # --- Routines: the ledger the ticker drives ----------------------------------------------
    # Transitions are pure functions from ``conduit_core.routines.ledger`` passed in by the
    # caller and applied to the freshly read row inside one write transaction.

    @abstractmethod
    async def create_routine(
        self, routine: Routine, *, bound_work_owner_check: BoundWorkCheck
    ) -> Routine:
        """Store a new Routine (``routine_exists`` if the id is taken). The check sees the bound
        Work as read in the same transaction and may refuse, or return it stamped with its firing
        owner (saved in the same commit)."""

    @abstractmethod
    async def put_routines(self, routines: Sequence[Routine]) -> None:
        """Insert many new Routine rows at once (bulk loads, benchmarks)."""

    @abstractmethod
    async def apply_routine(
        self,
        routine_id: str,
        change: RoutineChange,
        *,
        run: RoutineRun | None = None,
        events: Sequence[Event] = (),
    ) -> Routine:
        """Apply ``change`` to the fresh row (it raises to refuse: nothing is written), upsert
        the run-history row ``run`` and accept ``events``, atomically."""

    @abstractmethod
    async def apply_routines(
        self, updates: Sequence[RoutineUpdate]
    ) -> list[Routine | ConduitError]:
        """``apply_routine`` for each update, in order, in one transaction (a Routine claim
        pass fires and settles many at once). Each result is the Routine as written or the
        error that refused that update (``illegal_transition``, ``stale_routine_claim``,
        ``not_found``), which wrote nothing; the other updates are written."""

    @abstractmethod
    async def due_pass(self, *, now_ms: int) -> int:
        """Queue every idle Routine with ``next_run_at <= now``; returns how many."""

    @abstractmethod
    async def claim_queued(
        self, change: RoutineChange, *, limit: int, due_at_ms: int | None = None
    ) -> list[Routine]:
        """Claim queued Routines with ``change`` (queued -> claimed), each only while still
        queued; the rows another ticker won are simply not returned. ``due_at_ms`` runs the
        due-pass for that instant first, in the same transaction."""

    @abstractmethod
    async def heal_routines(self, heal: Callable[[Routine], Routine | None]) -> list[Routine]:
        """Apply ``heal`` to every claimed or running Routine, in one transaction."""

    @abstractmethod
    async def running_routines(self) -> list[Routine]:
        """Routines whose fire is claimed or running."""

    @abstractmethod
    async def running_fires(
        self, input_id: Callable[[Routine], str | None], *, ids: Sequence[str] | None = None
    ) -> list[tuple[Routine, Work | None, bool]]:
        """Each claimed or running Routine (only those of ``ids``, if given) with the Work its
        fire fed (``None`` when it has none or that Work is gone) and whether the event
        ``input_id(routine)`` is pending; one read, whatever the count (the ticker settles
        finished fires from it)."""

    @abstractmethod
    async def next_due_at(self) -> int | None:
        """The earliest ``next_run_at`` over idle and queued Routines."""

    @abstractmethod
    async def routine_history(self, routine_id: str, *, limit: int = 50) -> list[RoutineRun]:
        """The Routine's fires, newest first."""

    # --- Budgets and gates (admission) -------------------------------------------------------

    @abstractmethod
    async def admission_candidates(
        self,
        *,
        work_ids: Sequence[str],
        snapshot_for: Callable[[Work], AttemptSnapshot | None],
        capacity: CapacityLimits | None = None,
    ) -> list[Candidate]:
        """Read-only dry run of a claim: each Work of ``work_ids`` with its snapshot, the
        refusal eligibility or capacity would give it (slots are taken as if every admitted one
        were claimed) and its first pending input. ``snapshot_for`` returning ``None`` skips it.
        The ready queue is admitted by ``admit_ready``, without a dry run."""

    @abstractmethod
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
        """Charge staged usage, then per request: eligibility, capacity, the gate's hold
        (``gate_held``), budgets (``over_budget``, committing a budget hold), the claim and its
        ``turns``/``attempts`` charges, all in one transaction. A request the gates were not
        asked about (``GateVerdict.SKIP``) is refused if ``gates`` now says they must be."""

    @abstractmethod
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
        """``admission_candidates`` of the ready queue and ``admit_attempts`` of them, in one
        transaction: up to ``limit`` ready Work, oldest first, skipping Work another scheduler
        is claiming at that moment, each admitted unless a start gate must be asked first (its
        first start, and ``gates`` says a gate may hold it). That Work comes back unclaimed, as
        ``admission_candidates`` gives it, to ask the gates about and then pass to
        ``admit_attempts``."""

    @abstractmethod
    async def settle_budgets(self, budgets: BudgetPolicy, *, now_ms: int) -> int:
        """Charge every staged usage to its ledgers (dropped without budgets); how many."""

    @abstractmethod
    async def pending_usage(self) -> list[PendingUsage]:
        """Usage staged and not charged yet."""

    @abstractmethod
    async def release_budget_hold(
        self, work_id: str, *, reason: str, now_ms: int, actor: str | None = None
    ) -> Work:
        """Delete the Work's budget holds, leaving one pass; code ``gate_hold`` when only a
        start gate holds it, ``not_held`` when nothing does."""

    @abstractmethod
    async def settle_gate_hold(
        self, work_id: str, gate: str, *, admit: bool, reason: str, now_ms: int,
        actor: str | None = None,
    ) -> Work:  # fmt: skip
        """Settle gate ``gate``'s hold: admit leaves a gate pass, refuse cancels the Work.
        Idempotent; code ``no_gate_hold`` when that gate does not hold it."""

    @abstractmethod
    async def work_events(self, work_id: str) -> list[Event]:
        """Every event addressed to the Work (input and control history), in order."""

    @abstractmethod
    async def work_counts(self) -> dict[str, int]:
        """Work per listed state that has not ended (``ready``, ``running``, ``waiting``,
        ``held``, ``exhausted``; zero included) and ``startable``: the Work ``ready_work``
        would return now. One consistent read that reads no ended Work, so its cost follows
        the open Work, not the history (``/metrics`` reads it at every scrape)."""

    @abstractmethod
    async def ended_work_counts(self) -> dict[str, int]:
        """Ended Work per state (``completed``, ``failed``, ``cancelled``; zero included). It
        reads every ended Work's index entry: its cost grows with the history."""

    @abstractmethod
    async def held_work(self) -> list[tuple[Hold, Work]]:
        """Every hold of unfinished Work, with the Work."""


def _with_open_segment(ex: Execution, change: Callable[[Any], Any]) -> Execution:
    if not ex.segments or ex.segments[-1].ended_at_ms is not None:
        return ex
    return msgspec.structs.replace(ex, segments=[*ex.segments[:-1], change(ex.segments[-1])])


def refusal_error(refusal: ClaimRefusal) -> ConduitError:
    """The exception a single claim raises for a batched refusal."""
    from conduit_core.errors import CapacityError, NotFoundError

    if refusal.code.startswith("capacity_") or refusal.code == "concurrency_key":
        return CapacityError(refusal.message, code=refusal.code, limit_name=refusal.limit_name)
    if refusal.code == "not_found":
        return NotFoundError("work", refusal.work_id)
    return NotEligibleError(refusal.message, code=refusal.code)
