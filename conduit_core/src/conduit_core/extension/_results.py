"""What an executor hands back: results, usage, retry hints and the errors it may raise."""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Any

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.validation import MAX_AMOUNT

__all__ = [
    "Artifact",
    "CannotTellError",
    "LostSightError",
    "NotAcceptingError",
    "NotStartedError",
    "OperationError",
    "OutcomeKind",
    "ResourcesGoneError",
    "Result",
    "RetryHint",
    "TURN_STATUS_PATTERN",
    "Turn",
    "UNIT_PATTERN",
    "RESERVED_UNITS",
    "Usage",
    "WaitFor",
    "validate_result",
]

#: A usage unit or currency code: a lower-case letter, then lower-case letters, digits, ``_``.
UNIT_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
#: Units the core counts itself; an executor may not report them.
RESERVED_UNITS = frozenset({"turns", "attempts"})
#: A turn status: a lower-case letter, then up to 63 lower-case letters, digits, ``-`` or ``_``.
TURN_STATUS_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


class OutcomeKind(StrEnum):
    """How an attempt ended (or paused)."""

    COMPLETED = "completed"
    FAILED = "failed"
    HANDOFF = "handoff"
    WAITING = "waiting"


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Amounts an attempt consumed. ``units`` maps a unit name to an amount.

    ``cost`` is in ``currency`` (a lower-case code such as ``usd``); ``input_tokens`` and
    ``output_tokens`` are added together as the unit ``tokens``.
    """

    units: dict[str, float] = {}
    cost: float | None = None
    currency: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0

    def amounts(self) -> dict[str, float]:
        """Every unit this usage charges, cost and tokens included."""
        out = dict(self.units)
        if self.cost is not None and self.currency is not None:
            out[self.currency] = out.get(self.currency, 0.0) + self.cost
        tokens = self.input_tokens + self.output_tokens
        if tokens:
            out["tokens"] = out.get("tokens", 0.0) + tokens
        return out


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    """A turn declared by an outcome (schema ``core.turn.v1``)."""

    status: str
    comment: str = ""


class Artifact(msgspec.Struct, frozen=True, kw_only=True):
    """A reference to something an attempt produced (a path, URL or digest), never its content."""

    name: str
    ref: str
    media_type: str | None = None


class WaitFor(msgspec.Struct, frozen=True, kw_only=True):
    """What a ``waiting`` outcome waits for: event type and/or correlation key, and a timeout."""

    event_type: str | None = None
    correlation_key: str | None = None
    timeout_seconds: float | None = None


class RetryHint(msgspec.Struct, frozen=True, kw_only=True):
    """When trying again may succeed.

    ``reset_at`` is an epoch-milliseconds instant (retry at reset + 2 minutes); ``unknown_reset``
    asks for the default 30-minute delay. A hint still consumes the failure budget.
    """

    reset_at_ms: int | None = None
    unknown_reset: bool = False
    reason: str = ""


class Result(msgspec.Struct, frozen=True, kw_only=True):
    """The structured result of one attempt segment."""

    outcome: OutcomeKind
    summary: str = ""
    turn: Turn | None = None
    usage: Usage = Usage()
    artifacts: list[Artifact] = []
    permanent: bool = False
    retry_hint: RetryHint | None = None
    wait: WaitFor | None = None
    consumed_inputs: list[str] = []
    data: dict[str, Any] = {}


class OperationError(ConduitError):
    """An executor failure whose ``code`` and message are safe to store on the attempt summary.

    Any other exception an executor raises is recorded without its text, which may carry
    provider output.
    """

    code = "operation_failed"

    def __init__(
        self,
        code: str,
        message: str,
        *,
        permanent: bool = False,
        retry_hint: RetryHint | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.permanent = permanent
        self.retry_hint = retry_hint


class NotAcceptingError(OperationError):
    """The running attempt does not take injected input now; the input stays queued."""

    def __init__(self, message: str = "the attempt is not accepting input") -> None:
        super().__init__("not_accepting", message)


class NotStartedError(OperationError):
    """Raised by ``recover``: discovery through the launch intent proves nothing was started.

    The core then relaunches the attempt under the new epoch, marked ``relaunched``: no failure
    is counted and no retry is spent (a crash before anything started costs nothing).
    """

    def __init__(self, message: str = "nothing was started under the launch intent") -> None:
        super().__init__("not_started", message)


class ResourcesGoneError(OperationError):
    """Raised by ``recover``: everything the launch started is provably gone, with no result.

    The core records a failed attempt with its resource exclusion confirmed (the failure counts
    and the retry policy applies): the job may have run, so it is not relaunched as if it had not.
    """

    def __init__(self, message: str) -> None:
        super().__init__("resources_gone", message)


class CannotTellError(OperationError):
    """Raised by ``run``, ``resume`` or ``Handle.wait`` when they lost sight of what they
    started and recovery could not tell what became of it (an out-of-process program died under
    them and the restarted program's ``recover`` could not tell).

    The core holds the attempt, as it holds an unprovable recovery: unfinished, its slot and its
    Work kept, recovery asked again later or settled by a person's ``confirm-stopped``; never a
    counted failure whose retry could run the job twice. ``code`` is the executor's own.
    """


class LostSightError(OperationError):
    """Raised by ``run``, ``resume`` or ``Handle.wait`` when the executor lost sight of what it
    may have started (an out-of-process program died under them).

    The core hands the attempt to recovery at once: its lease is released, recovery claims it at
    the next epoch (a ``recovered`` segment, so launch resources named by execution and epoch
    never collide, and ``work show`` says what happened) and asks the pinned generation's
    ``recover`` what became of it — adopted, relaunched only when proven not started (and never
    past the deadline or after acknowledged recovery metadata), or held. Never a counted failure.
    """

    def __init__(self, message: str) -> None:
        super().__init__("executor_lost", message)


def validate_result(result: Result) -> None:
    """Refuse a result that a budget or the turn schema could not take.

    Raises :class:`OperationError` with code ``invalid_result`` naming the bad field.
    """
    for unit, amount in result.usage.units.items():
        _check_unit(f"usage.units.{unit}", unit)
        _check_amount(f"usage.units.{unit}", amount)
    if result.usage.cost is not None or result.usage.currency is not None:
        if result.usage.cost is None or result.usage.currency is None:
            raise OperationError("invalid_result", "usage.cost and usage.currency go together")
        _check_unit("usage.currency", result.usage.currency)
        _check_amount("usage.cost", result.usage.cost)
    for name in ("input_tokens", "output_tokens"):
        if not 0 <= getattr(result.usage, name) <= MAX_AMOUNT:
            raise OperationError(
                "invalid_result", f"usage.{name} must be >= 0 and <= {MAX_AMOUNT:g}"
            )
    if result.turn is not None and not TURN_STATUS_PATTERN.match(result.turn.status):
        raise OperationError(
            "invalid_result",
            f"turn.status {result.turn.status!r} must be a lower-case letter followed by up to "
            "63 lower-case letters, digits, '-' or '_'",
        )
    if result.outcome is OutcomeKind.WAITING and result.wait is None:
        raise OperationError("invalid_result", "a waiting outcome needs 'wait'")


def _check_unit(field: str, unit: str) -> None:
    if not UNIT_PATTERN.match(unit):
        raise OperationError("invalid_result", f"{field}: unit {unit!r} is not a valid unit name")
    if unit in RESERVED_UNITS:
        raise OperationError("invalid_result", f"{field}: unit {unit!r} is counted by the core")


def _check_amount(field: str, amount: float) -> None:
    # Bounded, so no sum of reported amounts can overflow a budget ledger.
    if not math.isfinite(amount) or amount < 0 or amount > MAX_AMOUNT:
        raise OperationError(
            "invalid_result", f"{field}: amount must be finite, >= 0 and <= {MAX_AMOUNT:g}"
        )
