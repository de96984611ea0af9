"""What the admission transaction (start gates' verdicts, budgets) takes from the runtime.

The store applies the runtime's budget policy inside its claim transaction through the pure
:class:`BudgetPolicy` protocol, so storage never imports the runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Protocol

import msgspec

from conduit_core.model import AttemptSnapshot, Event, Work

__all__ = [
    "AdmitRequest",
    "BudgetPolicy",
    "GateFilter",
    "GateVerdict",
    "LedgerSpec",
    "NoBudgets",
    "PendingUsage",
]


class GateVerdict(StrEnum):
    """What the start gates said before the claim transaction."""

    #: Not asked: the Work is past its first start, already gated, carries a pass, no gate is
    #: registered, or no gate may hold it (``GateFilter``). The transaction refuses it if the
    #: Work turns out to need the gates after all.
    SKIP = "skip"
    #: Every gate let it start.
    LET = "let"
    #: A gate held it (``holder``, ``reason``).
    HOLD = "hold"


#: Whether a start gate must be asked about a Work's first start, from the Work, its pinned
#: snapshot and its first pending input: the runtime asks each gate's synchronous ``may_hold``.
#: The store calls it inside its claim transaction, so it must be pure and never raise. ``None``
#: in its place means no gate is registered.
GateFilter = Callable[[Work, AttemptSnapshot, "Event | None"], bool]


class AdmitRequest(msgspec.Struct, frozen=True, kw_only=True):
    """Start the next attempt of ``work_id``, with what its start gates said."""

    work_id: str
    snapshot: AttemptSnapshot
    max_inputs: int | None = None
    gates: GateVerdict = GateVerdict.SKIP
    holder: str = ""
    reason: str = ""


class LedgerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One ledger a charge or a check applies to: a budget, its subject and window."""

    key: str
    budget: str
    unit: str
    subject: str
    window_start_ms: int
    max: float
    warn_at: float | None = None


class PendingUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Usage staged by an attempt-state write, charged at the next start or settle pass."""

    id: str
    work_id: str
    scope: str
    units: dict[str, float]
    staged_at_ms: int


class BudgetPolicy(Protocol):
    """Pure budget policy the store calls inside its transactions (never blocks, no I/O)."""

    @property
    def enabled(self) -> bool:
        """Whether any budget is configured (without one, staged usage is dropped)."""
        ...

    def ledgers(self, work_id: str, scope: str, unit: str | None, at_ms: int) -> list[LedgerSpec]:
        """The ledgers a Work's ``unit`` (every unit: ``None``) counts in at ``at_ms``."""
        ...

    def notices(
        self, spec: LedgerSpec, before: float, after: float, work_id: str, scope: str, now_ms: int
    ) -> list[Event]:
        """The warning/exceeded notices a charge from ``before`` to ``after`` accepts."""
        ...


class NoBudgets:
    """The policy when no budget is configured: nothing is charged or held."""

    enabled = False

    def ledgers(self, work_id: str, scope: str, unit: str | None, at_ms: int) -> list[LedgerSpec]:
        return []

    def notices(
        self, spec: LedgerSpec, before: float, after: float, work_id: str, scope: str, now_ms: int
    ) -> list[Event]:
        return []


#: Control events addressed to a held Work (history, never its input).
GATE_HELD = "core.gate.held"
GATE_RELEASED = "core.gate.released"
GATE_REFUSED = "core.gate.refused"
BUDGET_HELD = "core.budget.held"
BUDGET_RELEASED = "core.budget.released"
#: Routable root notices naming the Work in their data (``schema`` ``core.budget.v1``).
BUDGET_WARNING = "core.budget.warning"
BUDGET_EXCEEDED = "core.budget.exceeded"
BUDGET_SCHEMA = "core.budget.v1"
