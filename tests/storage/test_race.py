"""Races between processes, heavier than the conformance cases, and their negative controls.

A negative control runs the same race with one protection switched off (``CONDUIT_TEST_UNSAFE``,
inherited by the spawned racers; see ``conduit_core.storage._unsafe``) and asserts the detector
fails: a detector that cannot see the race it guards against would pass here too.
"""

from __future__ import annotations

import anyio
import pytest

from conduit_core.storage import open_store
from conduit_core.storage._race import HeldWindow, check_no_overlap, max_overlap, run_race
from conduit_core.storage.conformance import make_input, make_work

pytestmark = pytest.mark.anyio

RACERS, LIMIT, ROUNDS = 4, 3, 10


async def _capacity_race(url: str, *, create: bool = True) -> list[HeldWindow]:
    if create:
        store = await open_store(url)
        try:
            for i in range(6):
                await store.create_work(make_work(f"w{i}"), first_input=make_input(f"w{i}"))
        finally:
            await store.aclose()
    return await anyio.to_thread.run_sync(
        lambda: run_race(url, [], mode="ready", processes=RACERS, rounds=ROUNDS, limit=LIMIT)
    )


async def test_processes_never_hold_two_live_attempts_of_one_work(store_url: str) -> None:
    store = await open_store(store_url)
    work_ids = [f"w{i}" for i in range(3)]
    try:
        for work_id in work_ids:
            await store.create_work(make_work(work_id), first_input=make_input(work_id))
        windows = await anyio.to_thread.run_sync(
            lambda: run_race(store_url, work_ids, mode="pick", processes=RACERS, rounds=20)
        )
        check_no_overlap(windows)
        for work_id in work_ids:
            stored = [e.attempt for e in await store.list_executions(work_id)]
            assert stored == list(range(1, len(stored) + 1))
            assert sorted(a for w, a, _, _ in windows if w == work_id) == stored
            assert (await store.get_work(work_id)).last_attempt == len(stored)
        assert await store.live_executions() == []
    finally:
        await store.aclose()


async def test_four_processes_never_exceed_a_limit_of_three(store_url: str) -> None:
    windows = await _capacity_race(store_url)
    assert max_overlap(windows) <= LIMIT
    check_no_overlap(windows)
    assert len(windows) == LIMIT * ROUNDS  # every round filled the pool


@pytest.mark.parametrize(
    ("switch", "backends"),
    [("capacity_check", ("sqlite", "postgres")), ("capacity_lock", ("postgres",))],
)
async def test_negative_control_the_race_is_seen_without_its_protection(
    store_url: str, switch: str, backends: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = "sqlite" if store_url.startswith("sqlite") else "postgres"
    if backend not in backends:
        pytest.skip(f"{switch} protects nothing on {backend} (one writer by nature)")
    monkeypatch.setenv("CONDUIT_TEST_UNSAFE", switch)
    # One run sees it at least 19 times in 20 (bench/race_controls.py counts); three runs make
    # a false alarm here a one-in-thousands event.
    peaks: list[int] = []
    for run in range(3):
        peaks.append(max_overlap(await _capacity_race(store_url, create=run == 0)))
        if peaks[-1] > LIMIT:
            break
    assert peaks[-1] > LIMIT, f"the race stayed within the limit without {switch}: {peaks}"
