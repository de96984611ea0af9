"""Budget policy: which ledgers a charge counts in, their UTC windows, and the notices.

Pure: the store calls a :class:`BudgetBook` inside its admission transaction (it implements the
storage ``BudgetPolicy`` protocol). Usage is reported, not interpreted: the core counts ``turns``
and ``attempts``; every other unit comes from the executors' ``Result.usage``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from conduit_core.config import Budget
from conduit_core.model import Event
from conduit_core.storage import BUDGET_EXCEEDED, BUDGET_SCHEMA, BUDGET_WARNING, LedgerSpec

__all__ = ["BudgetBook", "BudgetNotice", "window_start"]

DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS
#: 1970-01-05, the first Monday after the epoch: UTC weeks start on Mondays.
_FIRST_MONDAY_MS = 4 * DAY_MS


def window_start(period: str, at_ms: int) -> int:
    """The start of the ledger window holding ``at_ms``: 0 for ``life``, else the UTC day/week."""
    if period == "day":
        return at_ms - at_ms % DAY_MS
    if period == "week":
        return (at_ms - _FIRST_MONDAY_MS) // WEEK_MS * WEEK_MS + _FIRST_MONDAY_MS
    return 0


class BudgetNotice(msgspec.Struct, frozen=True, kw_only=True):
    """The data of a ``core.budget.warning`` / ``core.budget.exceeded`` notice."""

    schema: str = BUDGET_SCHEMA
    kind: str  # warning | exceeded
    budget: str
    unit: str
    max: float
    used: float
    warn_at: float | None = None
    subject: str
    window_start_ms: int
    #: The Work whose charge (or held start) crossed the limit; named here, never addressed.
    work: str
    scope: str


class BudgetBook:
    """The configured budgets as a storage ``BudgetPolicy``."""

    def __init__(self, budgets: Sequence[Budget], scope_parents: Mapping[str, str]) -> None:
        self.budgets = tuple(budgets)
        self.scope_parents = dict(scope_parents)

    @property
    def enabled(self) -> bool:
        return bool(self.budgets)

    def _ancestry(self, scope: str) -> list[str]:
        chain = [scope]
        while (parent := self.scope_parents.get(chain[-1])) is not None and parent not in chain:
            chain.append(parent)
        return chain

    def ledgers(self, work_id: str, scope: str, unit: str | None, at_ms: int) -> list[LedgerSpec]:
        specs: list[LedgerSpec] = []
        chain: list[str] | None = None
        for budget in self.budgets:
            if unit is not None and budget.unit != unit:
                continue
            if budget.scope is not None:
                chain = chain if chain is not None else self._ancestry(scope)
                if budget.scope not in chain:
                    continue  # narrowed to a scope this Work is not in (nor below)
            if budget.per == "work":
                subject = f"work:{work_id}"
            elif budget.per == "scope":
                subject = f"scope:{scope}"
            else:
                subject = "all"
            start = window_start(budget.period, at_ms)
            specs.append(
                LedgerSpec(
                    key=f"{budget.name}|{subject}|{budget.period}:{start}",
                    budget=budget.name,
                    unit=budget.unit,
                    subject=subject,
                    window_start_ms=start,
                    max=budget.max,
                    warn_at=budget.warn_at,
                )
            )
        return specs

    def notices(
        self, spec: LedgerSpec, before: float, after: float, work_id: str, scope: str, now_ms: int
    ) -> list[Event]:
        """Notices for a ledger at ``after``; each is accepted once per window, kind, limit and
        scope (its delivery id), so a later charge past the same line adds nothing."""
        kinds: list[tuple[str, str]] = []
        if spec.warn_at is not None and after >= spec.warn_at * spec.max:
            kinds.append(("warning", BUDGET_WARNING))
        if after >= spec.max:
            kinds.append(("exceeded", BUDGET_EXCEEDED))
        events = []
        for kind, event_type in kinds:
            delivery = f"budget/{kind}/{spec.key}/{spec.max:g}/{scope}"
            notice = BudgetNotice(
                kind=kind, budget=spec.budget, unit=spec.unit, max=spec.max, used=after,
                warn_at=spec.warn_at, subject=spec.subject, window_start_ms=spec.window_start_ms,
                work=work_id, scope=scope,
            )  # fmt: skip
            events.append(
                Event(
                    id=delivery,
                    delivery_id=delivery,
                    type=event_type,
                    payload=msgspec.to_builtins(notice),
                    scope=scope,
                    # A routable root notice: never a Work's input.
                    unmatched=True,
                    accepted_at_ms=now_ms,
                )
            )
        return events
