"""Four processes hammer claims and completions on one Work set, on each backend."""

from __future__ import annotations

import anyio
import pytest

from conduit_core.storage import open_store
from conduit_core.storage.conformance import check_no_overlap, make_work, run_claim_race

pytestmark = pytest.mark.anyio


async def test_processes_never_hold_two_live_attempts_of_one_work(store_url: str) -> None:
    store = await open_store(store_url)
    work_ids = [f"w{i}" for i in range(6)]
    try:
        for work_id in work_ids:
            await store.create_work(make_work(work_id))
        records = await anyio.to_thread.run_sync(
            lambda: run_claim_race(store_url, work_ids, processes=4, rounds=120)
        )
        assert len(records) >= 40, "the race made too few claims to mean anything"
        check_no_overlap(records)
        for work_id in work_ids:
            stored = [e.attempt for e in await store.list_executions(work_id)]
            assert stored == list(range(1, len(stored) + 1))
            assert sorted(a for w, a, _, _ in records if w == work_id) == stored
            assert (await store.get_work(work_id)).last_attempt == len(stored)
        assert await store.live_executions() == []
    finally:
        await store.aclose()
