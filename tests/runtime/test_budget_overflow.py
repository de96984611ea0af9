"""A job's usage can never overflow a budget ledger and stop claims (issue 17, item 2).

Observed before: two results reporting ``widgets: 1.7e308`` made the ledger ``inf``, stored as
JSON ``null``; from then on every pass failed with ``ValidationError $.used`` and no Work in the
scope started, across restarts. Through the production scheduler on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio.to_thread
import pytest

from conduit_core.config import Budget
from conduit_core.model import WorkKind, WorkStatus
from conduit_core.runtime import Scheduler
from conduit_core.storage import NotEligibleError, SqlStore, Store
from tests.runtime.conftest import submit

pytestmark = pytest.mark.anyio

WIDGETS = Budget(name="widgets", unit="widgets", max=100, per="work")


async def test_a_huge_usage_amount_is_an_invalid_result_and_charges_nothing(
    make_scheduler: Callable[..., Scheduler], store: Store
) -> None:
    sched = make_scheduler(budgets=(WIDGETS,))
    for _ in range(2):
        work = await submit(sched, payload={"units": {"widgets": 1.7e308}})
        claim = await sched.claim(work.id)
        await sched.run_attempt(claim)
        ended = await store.get_execution(claim.execution.id)
        assert ended.failure_code == "invalid_result"
        assert "usage.units.widgets" in (ended.failure_message or "")
    await sched.settle_budgets()
    assert await store.list_ledgers() == []
    # Negative control: a bounded amount is charged.
    fine = await submit(sched, payload={"units": {"widgets": 7}})
    await sched.run_attempt(await sched.claim(fine.id))
    await sched.settle_budgets()
    assert [ledger.used for ledger in await store.list_ledgers()] == [7]


async def _write_ledger_json(store: Store, key: str, data: str) -> None:
    assert isinstance(store, SqlStore)

    def write(cx: Any) -> None:
        cx.run("UPDATE conduit_budget_ledger SET data = ? WHERE key = ?", (data, key))

    await anyio.to_thread.run_sync(lambda: store.transaction(write))


async def test_a_stored_overflowed_ledger_refuses_its_own_work_and_stops_nothing_else(
    make_scheduler: Callable[..., Scheduler], store: Store
) -> None:
    sched = make_scheduler(budgets=(WIDGETS,))
    spent = await submit(sched, kind=WorkKind.STANDING, payload={"units": {"widgets": 1}})
    await sched.run_attempt(await sched.claim(spent.id))
    await sched.settle_budgets()
    (ledger,) = await store.list_ledgers()
    # What an older release stored after the overflow: "used": null.
    await _write_ledger_json(
        store,
        ledger.key,
        json.dumps(
            {
                "v": 1,
                "key": ledger.key,
                "budget": "widgets",
                "unit": "widgets",
                "subject": ledger.subject,
                "window_start_ms": 0,
                "used": None,
            }
        ),
    )
    (read,) = await store.list_ledgers()
    assert read.used == 1e300
    assert read.exceeded

    other = await submit(sched, payload={"units": {"widgets": 2}})
    claim = await sched.claim(other.id)  # a pass over every ready Work does not fail
    await sched.run_attempt(claim)
    assert (await store.get_work(other.id)).status is WorkStatus.COMPLETED
    assert await sched.settle_budgets() == 1

    from conduit_core.model import Event

    now = sched.clock.now_ms()
    await sched.accept_input(
        Event(id=f"{spent.id}/in2", delivery_id=f"{spent.id}/in2", type="input",
              payload={"units": {"widgets": 1}}, work_id=spent.id, pending=True,
              accepted_at_ms=now)
    )  # fmt: skip
    with pytest.raises(NotEligibleError) as refused:
        await sched.claim(spent.id)
    assert refused.value.code == "over_budget"
