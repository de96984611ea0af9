"""The HTTP API's bodies: msgspec Structs that are also the source of the OpenAPI document.

Request bodies refuse unknown fields (a typo must not be silently ignored); response bodies are
plain records a newer daemon may extend with defaulted fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from conduit_core.extension import Result
from conduit_core.model import (
    DependencyFailure,
    Execution,
    ExecutionStatus,
    Hold,
    RecoveryHold,
    Segment,
    Work,
    WorkKind,
    WorkStatus,
    listed_status,
)
from conduit_core.validation import (
    ID_MAX_LENGTH,
    MAX_TEXT_LENGTH,
    Duration,
    NameStr,
    Priority,
    WorkIdStr,
)

__all__ = [
    "MAX_AFTER",
    "MAX_BATCH_ITEMS",
    "AttemptView",
    "BatchItemResult",
    "BatchSubmitRequest",
    "BatchSubmitResult",
    "CancelRequest",
    "CapacityView",
    "DebounceRequest",
    "ConfirmStoppedRequest",
    "ErrorBody",
    "EventView",
    "Health",
    "ProgramView",
    "InputRequest",
    "InputView",
    "InterruptRequest",
    "KeyCapacity",
    "PoolCapacity",
    "RetryRequest",
    "ScopeCapacity",
    "SubmitRequest",
    "Waiting",
    "WorkDetail",
    "WorkPage",
    "WorkView",
    "attempt_view",
    "work_view",
]

# The grammar of conduit_core.validation, so HTTP refuses what every other door refuses.
WorkId = WorkIdStr
EventType = WorkIdStr
#: Free keys a caller chooses (correlation, delivery): bounded, any characters.
Key = Annotated[str, msgspec.Meta(min_length=1, max_length=ID_MAX_LENGTH)]
Reason = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_LENGTH)]


class _Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class _Response(msgspec.Struct, frozen=True, kw_only=True):
    pass


# --- requests ---------------------------------------------------------------------------------


#: Dependencies one Work may declare at most (``after``).
MAX_AFTER = 100


class DebounceRequest(_Request, frozen=True, kw_only=True):
    """Start ``quiet`` after the last submit with ``key``, never later than ``max_wait`` after
    the first; every submit's input is kept as one more input of that one Work."""

    key: Key
    quiet: Duration
    max_wait: Duration | None = None


class SubmitRequest(_Request, frozen=True, kw_only=True, omit_defaults=True):
    """Create Work for ``binding`` with its first input (``input`` becomes its payload).

    Fields left at their defaults are not sent (a CLI still talks to a daemon that predates
    one, ``priority`` say)."""

    binding: NameStr
    scope: NameStr | None = None
    kind: WorkKind = WorkKind.TASK
    input: Any = None
    id: WorkId | None = None
    #: Claim order, -10 to 10, higher first (aged: a point is a minute of waiting); default:
    #: the binding's ``priority``.
    priority: Priority | None = None
    #: Ids of Work that must complete first (stored Work, or items of the same batch).
    after: Annotated[
        list[WorkId],
        msgspec.Meta(
            description=f"at most {MAX_AFTER} Work ids",
            extra_json_schema={"maxItems": MAX_AFTER},
        ),
    ] = []
    #: What this Work does when a dependency ends failed or cancelled (default ``cancel``).
    on_dependency_failure: DependencyFailure | None = None
    #: Return the Work already submitted with this key instead of a new one (docs/dedup.md);
    #: the binding's ``dedup_key`` template applies when absent.
    dedup_key: Key | None = None
    #: How long the key refers to its Work: until it starts, or until it ends.
    dedup: Literal["queued", "active"] | None = None
    #: Instead of ``dedup``: any Work with the key created within this span (``10m``).
    dedup_window: Duration | None = None
    #: Collapse submits with this key into one pending Work (docs/dedup.md).
    debounce: DebounceRequest | None = None


#: Items one ``POST /v1/work/batch`` takes at most (more is refused whole: ``too_many_items``).
MAX_BATCH_ITEMS = 1000


class BatchSubmitRequest(_Request, frozen=True, kw_only=True):
    """Many submits in one request and one store transaction; each item is decided alone."""

    items: Annotated[
        list[SubmitRequest],
        msgspec.Meta(
            description=f"at most {MAX_BATCH_ITEMS} items",
            extra_json_schema={"maxItems": MAX_BATCH_ITEMS},
        ),
    ]


class InputRequest(_Request, frozen=True, kw_only=True):
    """An input event for a Work; ``delivery_id`` makes a resend idempotent."""

    payload: Any = None
    type: EventType = "core.input"
    correlation_key: Key | None = None
    delivery_id: Key | None = None


class CancelRequest(_Request, frozen=True, kw_only=True):
    reason: Reason = ""


class RetryRequest(_Request, frozen=True, kw_only=True):
    reason: Reason = ""


class InterruptRequest(_Request, frozen=True, kw_only=True):
    reason: Reason = ""


class ConfirmStoppedRequest(_Request, frozen=True, kw_only=True):
    """A person confirms that the Work's held attempt no longer runs, for ``epoch``."""

    epoch: Annotated[int, msgspec.Meta(ge=1)]
    reason: Reason = ""
    #: Who confirms (recorded in the audit event); default ``api``.
    by: Annotated[str, msgspec.Meta(max_length=128)] = ""


# --- responses --------------------------------------------------------------------------------


class ErrorBody(_Response, frozen=True, kw_only=True):
    error: str
    code: str


class Waiting(_Response, frozen=True, kw_only=True):
    """Why ready Work did not start on the daemon's last pass (or what holds it)."""

    code: str
    message: str
    #: The pool, ``global``, ``scope:<id>`` or ``key:<key>`` whose limit held it back.
    limit_name: str = ""


class WorkView(_Response, frozen=True, kw_only=True):
    id: str
    scope: str
    binding: str
    kind: WorkKind
    status: WorkStatus
    scheduled_by: str
    created_at_ms: int
    updated_at_ms: int
    last_attempt: int
    failure_count: int
    blocked_reason: str | None = None
    retry_pending: bool = False
    pending_inputs: int = 0
    #: The name of the token whose cancel (or refusal) ended it.
    cancelled_by: str | None = None
    #: What the Work list shows and filters on: ``status``, or ``exhausted`` for ready Work
    #: blocked until a person's retry (retries exhausted, or a permanent failure).
    state: str = ""
    priority: int = 0
    #: Its binding's ``concurrency_key`` rendered over its first input, and that key's limit.
    concurrency_key: str | None = None
    key_limit: int = 1
    #: The Work it was declared to run after (``after`` at submit).
    after: list[str] = []
    #: Those of ``after`` that have not ended yet: it does not start while any is left.
    waiting_for: list[str] = []
    on_dependency_failure: DependencyFailure | None = None
    #: The dependency whose failure or cancellation cancelled or held it.
    dependency_failed: str | None = None
    #: The dedup or debounce key it was submitted under.
    dedup_key: str | None = None
    #: While a debounce holds its start: when it may start (a later submit may push it).
    debounce_until_ms: int | None = None


class AttemptView(_Response, frozen=True, kw_only=True):
    id: str
    attempt: int
    epoch: int
    status: ExecutionStatus
    binding: str
    executor: str
    executor_generation: int
    config_generation: int
    pool: str | None = None
    started_at_ms: int
    ended_at_ms: int | None = None
    failure_code: str | None = None
    failure_message: str | None = None
    exclusion_confirmed: bool = False
    #: Set while recovery is held: why, since when, and how to settle it.
    recovery_hold: RecoveryHold | None = None
    result: Result | None = None
    segments: list[Segment] = []
    dropped_segments: int = 0


class WorkDetail(_Response, frozen=True, kw_only=True):
    work: WorkView
    #: A submit's answer: the key named Work that already existed (HTTP 200, not 201).
    deduplicated: bool = False
    attempts: list[AttemptView] = []
    holds: list[Hold] = []
    waiting: Waiting | None = None


class WorkPage(_Response, frozen=True, kw_only=True):
    items: list[WorkView]
    #: Pass as ``after`` for the next page (an opaque cursor); ``null`` on the last one.
    next: str | None = None
    #: An input-key search read its bound of rows before filling the page: more may match
    #: past ``next``.
    partial: bool = False


class BatchItemResult(_Response, frozen=True, kw_only=True):
    """One item of a batch, in request order: created (its Work id), or refused and why."""

    index: int
    #: The created Work's id; for a refused item, the id it asked for (if any).
    id: str | None = None
    created: bool
    error: str | None = None
    code: str | None = None
    #: Not created: the item's dedup or debounce key named this existing Work (``id``).
    deduplicated: bool = False


class BatchSubmitResult(_Response, frozen=True, kw_only=True):
    items: list[BatchItemResult]
    created: int
    refused: int
    #: Items answered with the Work their key already named.
    deduplicated: int = 0


class EventView(_Response, frozen=True, kw_only=True):
    id: str
    type: str
    work_id: str | None = None
    seq: int
    accepted_at_ms: int
    #: Parked attempts this input woke.
    resumed: list[str] = []
    #: For an inject: the control intent that delivers it to the running attempt.
    control_id: str | None = None
    #: The name of the token that sent it.
    actor: str | None = None


class InputView(_Response, frozen=True, kw_only=True):
    """An input of a Work: presented to ``attempt``, or still ``pending`` (not yet presented)."""

    id: str
    type: str
    seq: int
    accepted_at_ms: int
    payload: Any = None
    correlation_key: str | None = None
    attempt: int | None = None
    pending: bool = False
    #: The name of the token that sent it (``None``: conduit itself, or before named tokens).
    actor: str | None = None


class PoolCapacity(_Response, frozen=True, kw_only=True):
    name: str
    limit: int | None = None
    #: Attempts holding a slot (live, or ended with their resource exclusion unconfirmed).
    in_use: int
    #: Ready Work the daemon's last pass could not start because of this limit.
    waiting: int = 0


class ScopeCapacity(_Response, frozen=True, kw_only=True):
    name: str
    limit: int | None = None
    in_use: int
    waiting: int = 0


class KeyCapacity(_Response, frozen=True, kw_only=True):
    """A concurrency key at its limit: its attempts holding a slot, and the ready Work it holds
    back (``waiting for key``)."""

    name: str
    limit: int
    in_use: int
    waiting: int


class CapacityView(_Response, frozen=True, kw_only=True):
    pools: list[PoolCapacity]
    scopes: list[ScopeCapacity] = []
    #: The concurrency keys at their limit with ready Work waiting, most waiting first (at most
    #: ``KEYS_SHOWN``; ``keys_waiting`` counts over every key).
    keys: list[KeyCapacity] = []
    #: Ready Work waiting for a concurrency key at its limit, over every key.
    keys_waiting: int = 0
    #: When the waiting counts were taken (the daemon's last pass); ``null`` without a daemon.
    waiting_at_ms: int | None = None


class ProgramView(_Response, frozen=True, kw_only=True):
    """One out-of-process executor program as this daemon's supervisor sees it."""

    executor: str
    command: list[str]
    #: ``not started`` (no attempt needed it yet), ``running``, ``gone`` (it died; the next
    #: request starts it again), ``restarting``, ``failed`` (its last start failed).
    status: str
    pid: int | None = None
    #: Times the program died (exited, hung, wrote garbage) and was started again.
    restarts: int = 0
    #: Starts that failed (no handshake, wrong manifest); the next request tries again.
    failed_starts: int = 0
    protocol_errors: int = 0
    last_error: str = ""


class Health(_Response, frozen=True, kw_only=True):
    status: str
    version: str
    owner: str
    store: str
    config_generation: int
    running_attempts: int = 0
    stopping: bool = False
    #: Draining: no new claims; it exits once its running attempts have ended.
    draining: bool = False
    #: This daemon's host labels (``settings.labels``).
    labels: list[str] = []
    #: Work that could start now, per binding (the queue's depth; bindings with none left out).
    ready_depth: dict[str, int] = {}
    #: This daemon's executor programs (``[executors.NAME]`` and packaged ones), by executor.
    programs: list[ProgramView] = []


# --- conversions ------------------------------------------------------------------------------


def work_view(work: Work) -> WorkView:
    return WorkView(
        id=work.id,
        scope=work.scope,
        binding=work.binding,
        kind=work.kind,
        status=work.status,
        scheduled_by=work.scheduled_by,
        created_at_ms=work.created_at_ms,
        updated_at_ms=work.updated_at_ms,
        last_attempt=work.last_attempt,
        failure_count=work.failure_count,
        blocked_reason=work.blocked_reason,
        retry_pending=work.retry_timer_id is not None,
        pending_inputs=work.pending_inputs,
        cancelled_by=work.cancelled_by,
        state=listed_status(work),
        priority=work.priority,
        concurrency_key=work.concurrency_key,
        key_limit=work.key_limit,
        **_dependency_fields(work),
        dedup_key=work.dedup_key,
        debounce_until_ms=work.debounce.due_ms if work.debounce is not None else None,
    )


def _dependency_fields(work: Work) -> dict[str, Any]:
    deps = work.dependencies
    if deps is None:
        return {}
    return {
        "after": deps.after,
        "waiting_for": deps.waiting_for,
        "on_dependency_failure": deps.on_failure,
        "dependency_failed": deps.failed,
    }


def attempt_view(ex: Execution) -> AttemptView:
    snap = ex.snapshot
    return AttemptView(
        id=ex.id,
        attempt=ex.attempt,
        epoch=ex.epoch,
        status=ex.status,
        binding=snap.binding,
        executor=snap.executor,
        executor_generation=snap.executor_generation,
        config_generation=snap.config_generation,
        pool=snap.pool,
        started_at_ms=ex.started_at_ms,
        ended_at_ms=ex.ended_at_ms,
        failure_code=ex.failure_code,
        failure_message=ex.failure_message,
        exclusion_confirmed=ex.exclusion_confirmed,
        recovery_hold=ex.recovery_hold,
        result=ex.result,
        segments=list(ex.segments),
        dropped_segments=ex.dropped_segments,
    )
