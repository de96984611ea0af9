"""Races between processes, heavier than the conformance cases, and their negative controls.

Every limit a claim checks is raced: the global limit, a named pool and a scope limit (reached
as an ancestor), four racer processes at once against a limit of 3. A negative control runs the
same race with one protection switched off (``CONDUIT_TEST_UNSAFE``, inherited by the spawned
racers; see ``conduit_core/extension/_switches.py``) and asserts the detector sees the
violation in at least 2 of 3 runs: a detector that cannot see the race it guards against would
pass here too. ``bench/race_controls.py`` counts the same over 20 runs (target: 19 of 20).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from conduit_core.storage import open_store
from conduit_core.storage._race import (
    LIMIT_KINDS,
    HeldWindow,
    check_no_overlap,
    drop_one_live_index,
    max_overlap,
    overlaps,
    race_scope,
    run_race,
)
from conduit_core.storage.conformance import make_input, make_work

pytestmark = pytest.mark.anyio

RACERS, LIMIT, ROUNDS = 4, 3, 10
#: A negative control passes when its detector saw the violation in K of N runs.
K, N = 2, 3


async def _make_work(url: str, work_ids: list[str], kind: str = "global") -> None:
    store = await open_store(url)
    try:
        for n, work_id in enumerate(work_ids):
            work = make_work(work_id, scope=race_scope(kind, n))
            await store.create_work(work, first_input=make_input(work_id))
    finally:
        await store.aclose()


async def _capacity_race(url: str, kind: str, *, create: bool = True) -> list[HeldWindow]:
    if create:
        await _make_work(url, [f"w{i}" for i in range(6)], kind)
    return await anyio.to_thread.run_sync(
        lambda: run_race(
            url, [], mode="ready", processes=RACERS, rounds=ROUNDS, limit=LIMIT, kind=kind
        )
    )


async def _k_of_n(seen_in_run: Callable[[int], Awaitable[bool]]) -> list[bool]:
    """Up to N runs, stopping once the verdict (K of N seen, or not) is decided."""
    seen: list[bool] = []
    while len(seen) < N and K > sum(seen) >= K - (N - len(seen)):
        seen.append(await seen_in_run(len(seen)))
    return seen


async def test_processes_never_hold_two_live_attempts_of_one_work(store_url: str) -> None:
    store = await open_store(store_url)
    work_ids = [f"w{i}" for i in range(3)]
    try:
        await _make_work(store_url, work_ids)
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


@pytest.mark.parametrize("kind", LIMIT_KINDS)
async def test_four_processes_never_exceed_a_limit_of_three(store_url: str, kind: str) -> None:
    windows = await _capacity_race(store_url, kind)
    assert max_overlap(windows) <= LIMIT
    check_no_overlap(windows)
    assert len(windows) == LIMIT * ROUNDS  # every round filled the pool


@pytest.mark.parametrize("kind", LIMIT_KINDS)
@pytest.mark.parametrize(
    ("switch", "backends"),
    [("capacity_check", ("sqlite", "postgres")), ("capacity_lock", ("postgres",))],
)
async def test_negative_control_the_race_is_seen_without_its_protection(
    store_url: str, switch: str, backends: tuple[str, ...], kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    backend = "sqlite" if store_url.startswith("sqlite") else "postgres"
    if backend not in backends:
        pytest.skip(f"{switch} protects nothing on {backend} (one writer by nature)")
    monkeypatch.setenv("CONDUIT_TEST_UNSAFE", switch)
    peaks: list[int] = []

    async def exceeded(run: int) -> bool:
        peaks.append(max_overlap(await _capacity_race(store_url, kind, create=run == 0)))
        return peaks[-1] > LIMIT

    seen = await _k_of_n(exceeded)
    assert sum(seen) >= K, f"the {kind} limit held without {switch} in too many runs: {peaks}"


async def test_negative_control_two_attempts_of_one_work_are_seen_without_exclusion(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the claim's exclusivity check (``work_exclusion``) and the one-live index, two
    racers that pick the same Work both start it, and the detector sees them overlap."""
    work_ids = [f"w{i}" for i in range(3)]
    await _make_work(store_url, work_ids)
    await anyio.to_thread.run_sync(drop_one_live_index, store_url)
    monkeypatch.setenv("CONDUIT_TEST_UNSAFE", "work_exclusion")
    found: list[list[str]] = []

    async def overlapped(run: int) -> bool:
        windows = await anyio.to_thread.run_sync(
            lambda: run_race(store_url, work_ids, mode="pick", processes=RACERS, rounds=ROUNDS)
        )
        found.append(overlaps(windows))
        return bool(found[-1])

    seen = await _k_of_n(overlapped)
    assert sum(seen) >= K, f"no two attempts of one Work overlapped in too many runs: {found}"
