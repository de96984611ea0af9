"""Durable records: msgspec Structs the stores keep and the runtime reads.

Schema evolution rules: every field added later gets a default; a field never changes its type;
no ``array_like``. Unknown fields are ignored on decode, so an older conduit reading a newer row
keeps working (the store's schema version guards incompatible changes). All instants are integer
epoch milliseconds (UTC).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec

from conduit_core.extension import Capability, PhaseOutcome, Result
from conduit_core.validation import MAX_THEN_STEPS

__all__ = [
    "EXHAUSTED",
    "AttemptSnapshot",
    "BudgetLedger",
    "ConfigGeneration",
    "ControlIntent",
    "ControlKind",
    "DebounceHold",
    "ControlStatus",
    "DAEMON_HEARTBEAT_MS",
    "DAEMON_LOST_AFTER_MS",
    "DaemonRecord",
    "DaemonState",
    "Dependencies",
    "DependencyFailure",
    "ErrorFallback",
    "Event",
    "Execution",
    "ExecutionStatus",
    "HandoffPolicy",
    "Hold",
    "HoldKind",
    "Invoke",
    "LaunchPhase",
    "Lease",
    "MAX_LAUNCH_PHASES",
    "MAX_SEGMENTS",
    "MAX_THEN_STEPS",
    "MisfirePolicy",
    "RecoveryHold",
    "RetryPolicy",
    "Routine",
    "RoutineStatus",
    "Segment",
    "Timer",
    "TimerKind",
    "Wait",
    "Work",
    "WorkKind",
    "WorkStatus",
    "WorkStep",
    "WorkTemplate",
    "listed_status",
]

MAX_SEGMENTS = 50
MAX_LAUNCH_PHASES = 32


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every durable record."""


# --- Work and input -------------------------------------------------------------------------


class WorkKind(StrEnum):
    #: Completes after a completed attempt; a handoff leaves it ready for more input.
    TASK = "task"
    #: Returns to ready after every completed attempt; a hintless failure arms no retry.
    STANDING = "standing"
    #: Does all its work in one attempt: a handoff settles it as completed.
    RUN_ONCE = "run_once"


class WorkStatus(StrEnum):
    READY = "ready"  # eligible when it has pending input and no retry backoff
    RUNNING = "running"  # has a live (unfinished, not parked) attempt
    WAITING = "waiting"  # its attempt is parked on a wait
    HELD = "held"  # a budget or gate hold stops its next start
    COMPLETED = "completed"
    FAILED = "failed"  # exhausted with terminal_on_exhaustion
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (WorkStatus.COMPLETED, WorkStatus.FAILED, WorkStatus.CANCELLED)


class DependencyFailure(StrEnum):
    """What a dependent does when a dependency ends failed or cancelled."""

    CANCEL = "cancel"  # cancelled too (and its own dependents after it, by their policy)
    HOLD = "hold"  # blocked (``dependency_failed``) until a person retries or cancels it
    RUN = "run"  # runs anyway, as if the dependency had completed


class Dependencies(Record, frozen=True, kw_only=True):
    """What a Work declared with ``after`` and what is left of it; kept by the store.

    ``waiting_for`` shrinks in the transaction that ends each dependency (see
    ``storage/_ops_dependencies.py``); while it is not empty the Work is not claimable.
    """

    after: list[str]
    waiting_for: list[str] = []
    on_failure: DependencyFailure = DependencyFailure.CANCEL
    #: The dependency whose failure or cancellation cancelled or held this Work.
    failed: str | None = None


class DebounceHold(Record, frozen=True, kw_only=True):
    """A debounced Work's pending start (docs/dedup.md)."""

    #: The timer whose firing releases the Work (a push replaces it with a later one).
    timer_id: str
    #: When that timer is due: last submit + quiet, capped by ``deadline_ms``.
    due_ms: int
    #: First submit + max wait: no later submit pushes the start past it (``None``: no max).
    deadline_ms: int | None = None


class Work(Record, frozen=True, kw_only=True):
    id: str
    scope: str
    binding: str
    kind: WorkKind = WorkKind.TASK
    status: WorkStatus = WorkStatus.READY
    #: The firing owner of record: ``manual`` or ``routine:<id>``.
    scheduled_by: str = "manual"
    correlation_keys: list[str] = []
    created_at_ms: int
    updated_at_ms: int
    #: Highest attempt number so far (attempt numbers are monotonic, never reused).
    last_attempt: int = 0
    #: Failures since the last success or manual retry (separate from attempt numbers).
    failure_count: int = 0
    #: Why the Work may not start by itself (``permanent_failure``, ``retry_exhausted``, …).
    blocked_reason: str | None = None
    #: Set while a retry timer is armed: no start before that timer fires.
    retry_timer_id: str | None = None
    #: Acceptance sequence of the failure a retry must follow.
    failure_seq: int = 0
    #: A gate pass left by an admitted gate hold, spent by the next admitted start.
    gate_pass: bool = False
    budget_pass: bool = False
    gated: bool = False  # the start gates were asked and let it start
    #: Accepted input addressed to this Work not yet presented to an attempt (kept by the store).
    pending_inputs: int = 0
    #: The named API token (``[[tokens]]``) whose cancel (or refusal) ended the Work.
    cancelled_by: str | None = None
    #: Claim order: each point of priority counts as a minute of waiting (docs/runtime.md,
    #: "Priorities"); from the submit, else the binding's ``priority``.
    priority: int = 0
    #: The binding's ``concurrency_key`` rendered over the first input at submit: at most
    #: ``key_limit`` attempts of Work with this key hold a slot at once, across every daemon.
    concurrency_key: str | None = None
    key_limit: int = 1
    #: Declared with ``after`` at submit; ``None`` (nothing extra stored) for most Work.
    dependencies: Dependencies | None = None
    #: Some Work waits for this one: its end settles them in the same transaction.
    has_dependents: bool = False
    #: The dedup or debounce key it was submitted under (docs/dedup.md).
    dedup_key: str | None = None
    #: Set while a debounce holds its start (not claimable until its timer releases it).
    debounce: DebounceHold | None = None


#: The listed state of ready Work blocked until a person retries it (see ``listed_status``).
EXHAUSTED = "exhausted"


def listed_status(work: Work) -> str:
    """What the Work list shows and searches: the Work's status, except ``exhausted`` for ready
    Work that waits for a person's retry (retries exhausted under its policy, or a permanent
    failure); the record keeps ``ready`` and the ``blocked_reason``."""
    if work.status is WorkStatus.READY and work.blocked_reason is not None:
        return EXHAUSTED
    return str(work.status)


class Event(Record, frozen=True, kw_only=True):
    """An accepted event. ``seq`` orders input; ``delivery_id`` makes acceptance idempotent."""

    id: str
    seq: int = 0
    delivery_id: str
    type: str
    payload: Any = None
    work_id: str | None = None
    correlation_key: str | None = None
    scope: str | None = None
    #: The execution that published it (its own Work's waits never wake on it).
    published_by: str | None = None
    #: Input addressed to a Work and not yet presented to an attempt.
    pending: bool = False
    #: Accepted but not routed to any Work (turn events, notices).
    unmatched: bool = False
    accepted_at_ms: int
    #: The named API token (``[[tokens]]``) that sent it (a submit, input, inject, manual retry,
    #: gate or budget decision); ``None`` for what conduit itself or an untracked door wrote.
    actor: str | None = None


# --- Attempts -------------------------------------------------------------------------------


class ExecutionStatus(StrEnum):
    LAUNCHING = "launching"
    RUNNING = "running"
    RESUMING = "resuming"
    RECOVERING = "recovering"
    PARKED = "parked"
    COMPLETED = "completed"
    FAILED = "failed"
    HANDOFF = "handoff"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL_EXECUTION

    @property
    def live(self) -> bool:
        """Unfinished and not parked: holds a capacity slot and a lease."""
        return self in _LIVE_EXECUTION


_LIVE_EXECUTION = frozenset(
    {
        ExecutionStatus.LAUNCHING,
        ExecutionStatus.RUNNING,
        ExecutionStatus.RESUMING,
        ExecutionStatus.RECOVERING,
    }
)
_TERMINAL_EXECUTION = frozenset(
    {
        ExecutionStatus.COMPLETED,
        ExecutionStatus.FAILED,
        ExecutionStatus.HANDOFF,
        ExecutionStatus.CANCELLED,
        ExecutionStatus.TIMED_OUT,
    }
)


class ErrorFallback(StrEnum):
    """What a control does with its input when the executor errors: keep it queued or drop it."""

    QUEUE = "queue"
    DROP = "drop"


class HandoffPolicy(StrEnum):
    STOP = "stop"  # default: a handoff ends the attempt and leaves Work ready
    CONTINUE = "continue"  # publish a derived core.execution.handoff event


class RetryPolicy(Record, frozen=True, kw_only=True):
    #: Delays between failures; len + 1 attempts in total (at most 100 delays).
    delays_seconds: list[float] = msgspec.field(default_factory=lambda: [300.0, 600.0])
    terminal_on_exhaustion: bool = False


class AttemptSnapshot(Record, frozen=True, kw_only=True):
    """Everything an attempt pins at claim: recovery and control use exactly this."""

    config_generation: int
    binding: str
    binding_config: dict[str, Any] = {}
    executor: str
    executor_generation: int
    pool: str | None = None
    capabilities: list[Capability] = []
    retry_policy: RetryPolicy = RetryPolicy()
    timeout_seconds: float
    deadline_ms: int
    control_fallback: ErrorFallback = ErrorFallback.QUEUE
    handoff_policy: HandoffPolicy = HandoffPolicy.STOP


class Invoke(StrEnum):
    PENDING = "pending"  # set by the claim that began the segment
    CALLED = "called"  # set by the fenced write just before the executor is called


class LaunchPhase(Record, frozen=True, kw_only=True):
    name: str
    started_at_ms: int
    ended_at_ms: int | None = None
    outcome: PhaseOutcome | None = None


class Segment(Record, frozen=True, kw_only=True):
    """A stretch of lease-held time of one attempt."""

    epoch: int
    started_at_ms: int
    ended_at_ms: int | None = None
    recovered: bool = False
    relaunched: bool = False
    wake_event_id: str | None = None
    invoke: Invoke | None = None
    isolated: bool = False
    pin: str | None = None
    launch: list[LaunchPhase] = []
    #: Recovery metadata was acknowledged in this segment (or in the launch it adopted): the
    #: launch started something, so a recovery answer that nothing started contradicts the store.
    recovery_persisted: bool = False


class RecoveryHold(Record, frozen=True, kw_only=True):
    """Recovery could not tell whether the attempt's resources still run: it is held.

    The attempt stays ``recovering`` (unfinished, holding its slot, no new attempt of its Work),
    and recovery is tried again from ``retry_at_ms`` until the pinned generation settles it or a
    person confirms the stop for ``epoch``.
    """

    code: str
    message: str
    #: The epoch a person's ``confirm-stopped`` must name (it stays the same while held).
    epoch: int
    since_ms: int
    retry_at_ms: int
    #: Recoveries tried and held so far.
    tries: int = 1
    #: How to settle it, for people (reinstall what, or which confirm-stopped command).
    settle: str = ""


class Execution(Record, frozen=True, kw_only=True):
    """One attempt of a Work, with its pinned snapshot, segments and outcome."""

    id: str
    work_id: str
    attempt: int
    epoch: int = 1
    status: ExecutionStatus = ExecutionStatus.LAUNCHING
    snapshot: AttemptSnapshot
    scope: str
    #: Ids of the input events presented to this attempt (consumed-input history).
    inputs: list[str] = []
    segments: list[Segment] = []
    dropped_segments: int = 0
    dropped_active_ms: int = 0
    recovery: dict[str, Any] | None = None
    #: What the latest launch recorded before starting anything external (see
    #: ``ExecutionContext.record_launch_intent``); recovery discovers by it.
    launch_intent: dict[str, Any] | None = None
    #: Set while recovery is held (see :class:`RecoveryHold`); cleared when it is settled.
    recovery_hold: RecoveryHold | None = None
    remaining_budget_ms: int | None = None
    result: Result | None = None
    failure_code: str | None = None
    failure_message: str | None = None
    #: Resource exclusion: False until the attempt's resources are proven stopped.
    exclusion_confirmed: bool = False
    #: Usage already staged for budgets (so a stale copy never charges twice).
    charged: dict[str, float] = {}
    #: The epoch (segment) ``charged`` belongs to: a resumed segment reports its own usage.
    charged_epoch: int = 0
    #: Its Work's concurrency key (kept in a column: the key limit counts attempts by it).
    concurrency_key: str | None = None
    started_at_ms: int
    ended_at_ms: int | None = None


class Lease(Record, frozen=True, kw_only=True):
    """Authority over one attempt at one epoch, until ``expires_at_ms``."""

    execution_id: str
    work_id: str
    epoch: int
    owner: str
    token: str
    expires_at_ms: int
    duration_ms: int


# --- Holds, waits, timers, controls, budgets ------------------------------------------------


class HoldKind(StrEnum):
    BUDGET = "budget"
    GATE = "gate"


class Hold(Record, frozen=True, kw_only=True):
    work_id: str
    kind: HoldKind
    holder: str  # the budget key or the gate registration name
    reason: str
    created_at_ms: int


class Wait(Record, frozen=True, kw_only=True):
    """A parked attempt's wake predicate."""

    execution_id: str
    work_id: str
    event_type: str | None = None
    correlation_key: str | None = None
    timer_id: str | None = None
    created_at_ms: int


class TimerKind(StrEnum):
    RETRY = "retry"
    WAIT_TIMEOUT = "wait_timeout"
    DEADLINE = "deadline"
    DEBOUNCE = "debounce"


class Timer(Record, frozen=True, kw_only=True):
    id: str
    kind: TimerKind
    due_at_ms: int
    work_id: str | None = None
    execution_id: str | None = None
    #: For retry timers: the failure generation (Work.failure_seq) it was armed for.
    generation: int = 0
    payload: dict[str, Any] = {}


class ControlKind(StrEnum):
    INJECT = "inject"
    INTERRUPT = "interrupt"


class ControlStatus(StrEnum):
    PENDING = "pending"
    DISPATCHING = "dispatching"
    ACKNOWLEDGED = "acknowledged"
    CONSUMED = "consumed"
    NOT_ACCEPTING = "not_accepting"
    DROPPED = "dropped"
    FAILED = "failed"


class ControlIntent(Record, frozen=True, kw_only=True):
    id: str
    work_id: str
    execution_id: str
    epoch: int
    kind: ControlKind
    status: ControlStatus = ControlStatus.PENDING
    input_ids: list[str] = []
    dispatch_token: str | None = None
    fallback: ErrorFallback = ErrorFallback.QUEUE
    created_at_ms: int
    settled_at_ms: int | None = None
    #: The named API token (``[[tokens]]``) that asked for it.
    actor: str | None = None


class BudgetLedger(Record, frozen=True, kw_only=True):
    """Usage of one unit for one Work, scope or everything, in one window."""

    key: str  # budget name + subject + window start
    budget: str
    unit: str
    subject: str  # "work:<id>", "scope:<id>" or "all"
    window_start_ms: int
    used: float = 0.0
    warned: bool = False
    exceeded: bool = False


class ConfigGeneration(Record, frozen=True, kw_only=True):
    generation: int
    digest: str
    created_at_ms: int


# --- Routines --------------------------------------------------------------------------------


class RoutineStatus(StrEnum):
    IDLE = "idle"
    QUEUED = "queued"
    CLAIMED = "claimed"
    RUNNING = "running"
    ERROR = "error"
    PAUSED = "paused"


class MisfirePolicy(StrEnum):
    COALESCE = "coalesce"
    SKIP = "skip"


class WorkStep(Record, frozen=True, kw_only=True):
    """A Work a Routine's fire creates after the one before it (``WorkTemplate.then``)."""

    binding: str
    scope: str | None = None
    kind: WorkKind = WorkKind.TASK
    input: Any = None


class WorkTemplate(Record, frozen=True, kw_only=True):
    """What a Routine fire creates: a new Work, or input for a bound existing Work."""

    binding: str | None = None
    scope: str | None = None
    kind: WorkKind = WorkKind.TASK
    input: Any = None
    work_id: str | None = None  # bound: deliver input to this existing Work instead
    #: More Work the same fire creates, each ``after`` the one before (a small group: A then B).
    #: The fire is settled by the last one's end; a failure cancels the rest (the default
    #: ``on_dependency_failure``), which fails the fire.
    then: list[WorkStep] = []


class Routine(Record, frozen=True, kw_only=True):
    id: str
    scope: str
    target: WorkTemplate
    cron_spec: str
    timezone: str = "UTC"
    misfire: MisfirePolicy = MisfirePolicy.COALESCE
    grace_seconds: float = 60.0
    status: RoutineStatus = RoutineStatus.IDLE
    next_run_at_ms: int | None = None
    last_run_at_ms: int | None = None
    scheduled_for_ms: int | None = None
    last_error: str | None = None
    scheduled_by: str = "conduit"
    claim_owner: str | None = None
    claim_token: str | None = None
    claim_expires_at_ms: int | None = None
    fired_work_id: str | None = None
    from_config: bool = False
    created_at_ms: int
    updated_at_ms: int
    #: The named API token (``[[tokens]]``) whose pause, resume, run now or edit last changed it.
    changed_by: str | None = None


# --- Daemons ---------------------------------------------------------------------------------


#: How often a daemon writes its registry row (on a pass of its host loop, at most this often).
DAEMON_HEARTBEAT_MS = 5_000
#: A running or draining daemon whose row is older than this is shown as ``lost``.
DAEMON_LOST_AFTER_MS = 30_000


class DaemonState(StrEnum):
    RUNNING = "running"
    #: Claims nothing new; its running attempts finish, then it exits.
    DRAINING = "draining"
    STOPPED = "stopped"
    #: Not stored: a running or draining daemon whose heartbeat is too old (read-side only).
    LOST = "lost"


class DaemonRecord(Record, frozen=True, kw_only=True):
    """A daemon on the store (the registry ``conduit daemons`` lists): written at its start,
    on its heartbeat (a pass of its host loop, every few seconds) and at its exit."""

    #: The daemon's lease owner id (``host/pid/random``).
    id: str
    host: str
    pid: int
    labels: list[str] = []
    state: DaemonState = DaemonState.RUNNING
    #: Attempts it runs now (started, recovered or resumed by it, still observed).
    load: int = 0
    started_at_ms: int
    last_seen_ms: int

    def state_at(self, now_ms: int) -> DaemonState:
        """Its state as a reader tells it: ``lost`` once its heartbeat is too old."""
        if self.state is not DaemonState.STOPPED and now_ms - self.last_seen_ms > (
            DAEMON_LOST_AFTER_MS
        ):
            return DaemonState.LOST
        return self.state
