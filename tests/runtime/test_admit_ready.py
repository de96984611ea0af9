"""Admission takes ready Work in the transaction that locks it, skipping Work another scheduler
is claiming at that moment (PostgreSQL, where schedulers claim concurrently).

Before, a read-only dry run picked the oldest ready Work and the claim then locked it: two
schedulers' dry runs offered both the same oldest rows, and one of them refused each as "being
claimed by another scheduler" (in ``bench_processes``, two processes refused 7,869 rows while
claiming 4,000).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from conduit_core.model import WorkKind
from conduit_core.plugins import Plugins
from conduit_core.runtime import ManualClock, Scheduler
from conduit_core.storage import Store, open_store
from conduit_test_plugin import plugin as test_plugin
from tests.runtime.conftest import input_event, options, submit

pytestmark = pytest.mark.anyio


@pytest.fixture
async def pg_store(postgres_url: str) -> AsyncIterator[Store]:
    async with await open_store(postgres_url) as opened:
        yield opened


async def test_work_another_scheduler_is_claiming_is_skipped_not_refused(
    pg_store: Store, postgres_url: str, plugins: Plugins
) -> None:
    sched = Scheduler(pg_store, ManualClock(), plugins, options(concurrency=16))
    assert sched.admission.active()  # the test plugin's start gates
    # Standing Work past its first start: its next turns ask no gate, so admission admits them
    # in the transaction that locks them.
    works = [await submit(sched, kind=WorkKind.STANDING) for _ in range(6)]
    first, _ = await sched.claim_ready(10)
    assert len(first) == 6
    for claim in first:
        await sched.run_attempt(claim)
    for n, work in enumerate(works):
        await sched.accept_input(input_event(work.id, 2 + n))
    test_plugin.GATE_CALLS.clear()

    ids = sorted(w.id for w in works)
    busy, free = ids[:3], ids[3:]
    # Another scheduler, mid-claim: it holds the row locks of three of them.
    with psycopg.connect(postgres_url) as other:
        other.execute(
            "SELECT id FROM conduit_work WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (busy,)
        )
        claims, refusals = await sched.claim_ready(10)
        assert sorted(c.work.id for c in claims) == free
        assert refusals == []
        other.rollback()
    for claim in claims:
        await sched.run_attempt(claim)
    rest, refusals = await sched.claim_ready(10)
    assert sorted(c.work.id for c in rest) == busy
    assert refusals == []
    assert test_plugin.GATE_CALLS == []  # no second start asks the gates
