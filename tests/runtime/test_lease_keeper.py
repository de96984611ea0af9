"""The host's one lease keeper: a hold wakes it only when the keeper would look too late."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import anyio
import pytest

from conduit_core.runtime import SystemClock
from conduit_core.runtime._holder import LeaseKeeper
from conduit_core.storage import Claim, ClaimRequest, Store
from conduit_core.storage.conformance import make_input, make_work, snapshot
from tests.runtime.conftest import eventually

pytestmark = pytest.mark.anyio


async def _claimed(store: Store, work_id: str, now_ms: int, lease_ms: int) -> Claim:
    await store.create_work(make_work(work_id), first_input=make_input(work_id))
    return await store.claim_attempt(
        ClaimRequest(work_id=work_id, snapshot=snapshot()), owner="keeper-test", now_ms=now_ms,
        lease_ms=lease_ms,
    )  # fmt: skip


def _now(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """``condition`` as the async check ``eventually`` polls (the keeper's state is in memory)."""

    async def check() -> bool:
        return condition()

    return check


async def test_a_hold_due_before_the_keeper_looks_again_is_renewed_in_time(store: Store) -> None:
    clock = SystemClock()
    long = await _claimed(store, "long", clock.now_ms(), 60_000)
    short = await _claimed(store, "short", clock.now_ms(), 600)
    keeper = LeaseKeeper(store, clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(keeper.run)
        async with keeper.hold(long.lease):
            # The keeper waits, to look again a sixth of the long lease (10 s) from now.
            await eventually(_now(lambda: anyio.current_time() + 5 < keeper._wakes_at < math.inf))
            async with keeper.hold(short.lease) as held:
                # The body outlives the short lease three times over: it must be renewed (the
                # hold woke the keeper), never lost.
                await eventually(_now(lambda: held.renewals >= 3))
                assert held.lost is None
        tg.cancel_scope.cancel()
    assert (await store.get_lease(short.execution.id)) is not None


async def test_holds_due_after_the_keepers_next_look_do_not_wake_it(store: Store) -> None:
    clock = SystemClock()
    keeper = LeaseKeeper(store, clock)
    claims = [await _claimed(store, f"w{i}", clock.now_ms(), 60_000) for i in range(3)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(keeper.run)
        async with keeper.hold(claims[0].lease):
            await eventually(_now(lambda: anyio.current_time() + 5 < keeper._wakes_at < math.inf))
            woken = keeper._changed
            async with keeper.hold(claims[1].lease), keeper.hold(claims[2].lease):
                assert not woken.is_set(), "a hold due in 20 s woke a keeper looking in 10 s"
        tg.cancel_scope.cancel()
