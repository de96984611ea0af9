"""A claim sent with an attempt's settlement (``Scheduler.set_settling_listener``) runs after
it in their shared transaction and takes the slot it frees. On SQLite and PostgreSQL, through
the production scheduler."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from conduit_core.runtime import Scheduler
from conduit_core.storage import Claim, ClaimRefusal, Store, _sqlstore
from conduit_test_plugin import plugin as test_plugin
from tests.runtime.conftest import submit

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("claims_last", [True, False], ids=["claims-last", "control-claims-first"])
async def test_a_claim_sent_with_a_settlement_takes_the_slot_it_frees(
    make_scheduler: Callable[..., Scheduler],
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    claims_last: bool,
) -> None:
    # Plain Work, so the claim is one transaction (no gate to ask in between).
    monkeypatch.setattr(test_plugin, "ASK_EVERY_START", False)
    if not claims_last:
        # The negative control: the claim sorted first in the batch counts the slot as taken.
        monkeypatch.setattr(_sqlstore, "CLAIMS_FROM_THE_READY_QUEUE", frozenset())
    sched = make_scheduler(concurrency=1)
    first = await submit(sched)
    second = await submit(sched)
    (claim,), _ = await sched.claim_ready(10)
    assert claim.work.id == first.id
    # The slot is taken: the claim reads nothing of the queue (nothing to refuse row by row).
    assert await sched.claim_ready(10) == ([], [])
    assert await store.capacity_waiting(sched.capacity()) == {"global": 1}

    outcomes: list[tuple[list[Claim], list[ClaimRefusal]]] = []
    async with anyio.create_task_group() as tg:

        async def claim_now() -> None:
            outcomes.append(await sched.claim_ready(10))

        sched.set_settling_listener(lambda: tg.start_soon(claim_now))
        ended = await sched.run_attempt(claim)
    sched.set_settling_listener(None)

    assert ended.status.terminal
    ((claims, refusals),) = outcomes
    if claims_last:
        assert [c.work.id for c in claims] == [second.id]
        assert refusals == []
        await sched.run_attempt(claims[0])
    else:
        # Counted before the settlement frees the slot: no slot, so nothing read or claimed.
        assert (claims, refusals) == ([], [])


async def test_a_failing_settling_listener_never_keeps_an_attempt_from_settling(
    make_scheduler: Callable[..., Scheduler], caplog: pytest.LogCaptureFixture
) -> None:
    sched = make_scheduler()
    await submit(sched)
    (claim,), _ = await sched.claim_ready(10)

    def broken() -> None:
        raise RuntimeError("the host's task group is closed")

    sched.set_settling_listener(broken)
    ended = await sched.run_attempt(claim)
    assert ended.status.terminal
    assert (await sched.store.get_execution(claim.execution.id)).status.terminal
    assert "settling listener failed" in caplog.text
