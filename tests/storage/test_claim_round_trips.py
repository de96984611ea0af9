"""A claim batch from the ready queue reads in one round trip, or three, before it writes
(PostgreSQL).

Where every binding the claimer starts counts against one pool and no scope limit or
concurrency key applies, the limits a batch needs are known before it reads the queue: the
limit's row is locked, its slot holders counted and the oldest ready Work locked with their
pending input, all sent together. Otherwise ``admit_ready`` first counts the slot holders (unlocked: how many rows are worth reading), then
locks that many ready Work (with the staged usage), then needs their pending input and, with
capacity limits, the limits' rows locked and their slot holders counted again. The last two
depend only on which Work were locked, so they are sent together and taken in with one sync;
the server still runs them in the order sent (input read after its Work's lock, the count after
the limits' lock). Every claim must come out as it would have read one thing at a time.
"""

from __future__ import annotations

import pytest

from conduit_core.model import Work
from conduit_core.storage import CapacityLimits, Claim, Store, open_store
from conduit_core.storage._admission import NoBudgets
from conduit_core.storage.conformance import T0, make_input, make_work, snapshot
from tests.storage.conftest import count_syncs

pytestmark = pytest.mark.anyio


#: Limits whose rows a claim can lock before it reads the queue (every binding in one pool),
#: and limits it cannot (no binding's pool known: the Work it locks tell which limits apply).
ONE_POOL = CapacityLimits(pool_limits={"p": 3}, binding_pools={"b": "p", "c": "p"})
UNKNOWN_POOLS = CapacityLimits(global_limit=3)


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
@pytest.mark.parametrize(
    ("limits", "round_trips"), [(ONE_POOL, 2), (UNKNOWN_POOLS, 4)], ids=["one-pool", "unknown"]
)
async def test_a_claim_batch_takes_its_input_and_slot_counts_together(
    store_url: str, monkeypatch: pytest.MonkeyPatch, limits: CapacityLimits, round_trips: int
) -> None:
    async with await open_store(store_url) as store:
        await _ready(store, 4)
        syncs = count_syncs(monkeypatch) if store_url.startswith("postgresql") else None
        claims, asked = await store.admit_ready(
            limit=4, snapshot_for=lambda work: snapshot(), max_inputs=None, owner="o",
            now_ms=T0, lease_ms=30_000, capacity=limits,
            budgets=NoBudgets(), gates=None,
        )  # fmt: skip
        assert asked == []
        claimed = [c for c in claims if isinstance(c, Claim)]
        # The limit holds (3 of 4), and each claim consumed its own input, read in this batch.
        assert len(claimed) == 3
        # The fourth was never read: there was no slot for it (no refusal, still ready).
        assert [c for c in claims if not isinstance(c, Claim)] == []
        assert len(await store.ready_work(limit=10)) == 1
        for claim in claimed:
            assert [e.id for e in claim.inputs] == [f"ev-{claim.work.id}-in"]
            assert (await store.get_work(claim.work.id)).pending_inputs == 0
        if syncs is not None:
            # One pool: the limit locked and counted with the ready Work locked and their
            # input; the commit. Unknown: the slots counted; the ready Work locked; their input
            # with the limits locked and counted; the commit.
            assert syncs == [round_trips], f"round trips of the claim batch: {syncs}"


async def _ready(store: Store, count: int) -> list[Work]:
    made = []
    for i in range(count):
        work = make_work(f"w{i}")
        made.append(await store.create_work(work, first_input=make_input(f"w{i}-in")))
    return made
