"""The client's public records: msgspec Structs decoded straight from the daemon's JSON.

They are the client's own (not the daemon's internal Structs): a newer daemon may add fields
(ignored here), and statuses and kinds are plain strings (``"completed"``, ``"task"``).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

__all__ = [
    "TERMINAL_STATUSES",
    "AttemptResult",
    "AttemptView",
    "BatchItemResult",
    "BatchResult",
    "DaemonList",
    "DaemonView",
    "DrainView",
    "InputAccepted",
    "Outcome",
    "Settled",
    "Debounce",
    "SubmitItem",
    "Waiting",
    "WorkDetail",
    "WorkPage",
    "WorkView",
]

T = TypeVar("T")

#: Statuses a Work never leaves: :meth:`Client.wait` returns on them.
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})


class Debounce(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Collapse submits with ``key`` into one pending Work, started ``quiet`` after the last
    of them but never later than ``max_wait`` after the first (``"5s"``, ``"1m"``)."""

    key: str
    quiet: str
    max_wait: str | None = None


class SubmitItem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One Work to create: ``POST /v1/work``'s body, and an item of ``submit_many``.

    ``id`` is optional; give one to make a resend safe (it is then refused as ``work_exists``).
    ``dedup_key`` (with ``dedup`` ``"queued"``/``"active"`` or a ``dedup_window``) or
    ``debounce`` submit under a key (docs/dedup.md).
    """

    binding: str
    input: Any = None
    scope: str | None = None
    kind: str = "task"
    id: str | None = None
    #: -10 to 10, higher starts first (aged); ``None``: the binding's priority.
    priority: int | None = None
    #: Ids of Work that must complete first (stored, or earlier/later items of one batch).
    after: list[str] = []
    #: ``cancel`` (the server's default), ``hold`` or ``run``: see docs/dependencies.md.
    on_dependency_failure: str | None = None
    dedup_key: str | None = None
    dedup: str | None = None
    dedup_window: str | None = None
    debounce: Debounce | None = None


class WorkView(msgspec.Struct, frozen=True, kw_only=True):
    """A Work as listed: its status (``ready``, ``running``, ``waiting``, ``held``,
    ``completed``, ``failed``, ``cancelled``) and counters."""

    id: str
    scope: str
    binding: str
    kind: str
    status: str
    scheduled_by: str = ""
    created_at_ms: int = 0
    updated_at_ms: int = 0
    last_attempt: int = 0
    failure_count: int = 0
    blocked_reason: str | None = None
    retry_pending: bool = False
    pending_inputs: int = 0
    priority: int = 0
    concurrency_key: str | None = None
    key_limit: int = 1
    #: Declared ``after`` at submit, and those of them that have not ended yet.
    after: list[str] = []
    waiting_for: list[str] = []
    on_dependency_failure: str | None = None
    #: The dependency whose failure or cancellation cancelled or held it.
    dependency_failed: str | None = None
    dedup_key: str | None = None
    #: While a debounce holds its start: when it may start.
    debounce_until_ms: int | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def blocked(self) -> bool:
        """Failed and waiting for a person's retry: it will not move by itself."""
        return self.status == "ready" and bool(self.blocked_reason) and not self.retry_pending

    @property
    def settled(self) -> bool:
        """Terminal or blocked: what ``wait`` waits for."""
        return self.terminal or self.blocked


class AttemptResult(msgspec.Struct, frozen=True, kw_only=True):
    """What an attempt's executor reported; ``data`` is the job's structured result."""

    outcome: str
    summary: str = ""
    permanent: bool = False
    data: dict[str, Any] = {}


class AttemptView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    attempt: int
    epoch: int
    status: str
    binding: str = ""
    executor: str = ""
    started_at_ms: int = 0
    ended_at_ms: int | None = None
    failure_code: str | None = None
    failure_message: str | None = None
    result: AttemptResult | None = None


class Waiting(msgspec.Struct, frozen=True, kw_only=True):
    """Why ready Work did not start on the daemon's last pass, or what holds it."""

    code: str
    message: str
    limit_name: str = ""


class WorkDetail(msgspec.Struct, frozen=True, kw_only=True):
    work: WorkView
    attempts: list[AttemptView] = []
    #: The Work's holds (budget and gate holds), as the API gives them.
    holds: list[dict[str, Any]] = []
    waiting: Waiting | None = None
    #: A submit's answer: the Work its dedup or debounce key already named (nothing created).
    deduplicated: bool = False


class WorkPage(msgspec.Struct, frozen=True, kw_only=True):
    items: list[WorkView]
    #: Pass as ``after=`` for the next page; ``None`` on the last one.
    next: str | None = None


class BatchItemResult(msgspec.Struct, frozen=True, kw_only=True):
    """One item of ``submit_many``, in the order given: created (its ``id``), or refused
    with the API's ``code`` and ``error``."""

    index: int
    id: str | None = None
    created: bool
    error: str | None = None
    code: str | None = None
    #: Not created: its dedup or debounce key named this existing Work (``id``).
    deduplicated: bool = False


class BatchResult(msgspec.Struct, frozen=True, kw_only=True):
    items: list[BatchItemResult]
    created: int
    refused: int
    #: Items answered with the Work their key already named (neither created nor refused).
    deduplicated: int = 0

    @property
    def ids(self) -> list[str]:
        """The created Works' ids, in the order given."""
        return [item.id for item in self.items if item.created and item.id is not None]


class InputAccepted(msgspec.Struct, frozen=True, kw_only=True):
    """An input the daemon accepted for a Work (``POST /v1/work/{id}/input``)."""

    id: str
    type: str
    seq: int
    work_id: str | None = None
    accepted_at_ms: int = 0
    #: Parked attempts this input woke.
    resumed: list[str] = []


class Settled(msgspec.Struct, frozen=True, kw_only=True):
    """A human gate's hold approved or refused."""

    work_id: str
    status: str
    #: ``approved`` or ``refused`` (the Work is then cancelled).
    action: str


class Outcome(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    """A settled Work: its status and its last attempt's result.

    ``status`` is ``completed``, ``failed`` or ``cancelled``, or ``ready`` with a
    ``blocked_reason`` (failed, its retries spent: it waits for a person's ``retry``).
    ``data`` is the result's data decoded into the type given to ``wait`` (a ``dict`` without
    one); it is ``None`` unless the Work completed. ``raw_data`` is the data as sent.
    """

    id: str
    status: str
    data: T | None = None
    raw_data: dict[str, Any] = {}
    summary: str = ""
    failure_code: str | None = None
    failure_message: str | None = None
    blocked_reason: str | None = None
    attempts: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "completed"


class DaemonView(msgspec.Struct, frozen=True, kw_only=True):
    """One daemon on the store, as its registry row says (``GET /v1/daemons``)."""

    id: str
    host: str
    pid: int
    labels: list[str] = []
    #: ``running``, ``draining``, ``stopped`` or ``lost`` (running or draining, not seen for
    #: the list's ``lost_after_ms``).
    state: str
    #: Attempts it ran when it last wrote its row.
    load: int = 0
    started_at_ms: int = 0
    last_seen_ms: int = 0


class DaemonList(msgspec.Struct, frozen=True, kw_only=True):
    """Every daemon that ever wrote its row on the store, and when one counts as lost."""

    daemons: list[DaemonView]
    lost_after_ms: int = 0


class DrainView(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v1/daemon/drain``'s answer: the daemon that took the drain (``owner``) claims
    nothing new and exits 0 once its ``running_attempts`` have ended."""

    owner: str
    state: str
    running_attempts: int = 0
