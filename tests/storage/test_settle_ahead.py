"""Settlements batched together read their fences in one round trip (PostgreSQL).

``SqlStore`` gives a batch of two or more settlements of distinct attempts one read ahead that
fences and locks them all (``read_settlements_ahead``: one statement from
``ONE_STATEMENT_FROM``, one each sent together below) and runs them first. Each
must end as if it had read its own rows at its turn: an attempt written by another handle
since its holder last wrote it takes its own path and keeps the newer row; a Work that an
earlier settlement of the batch published an input to is read anew, so its pending count is
not lost. The negative control settles from the read-ahead Work regardless and loses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import pytest

from conduit_core.model import Event, Execution, ExecutionStatus, Work
from conduit_core.storage import AttemptEnd, Settlement, Store, _sqlstore
from conduit_core.storage import _ops_attempts as att
from conduit_core.storage.conformance import T0, make_input
from tests.storage.conftest import claimed_known, count_syncs, record_batch_sizes

pytestmark = pytest.mark.anyio

#: Both ways of reading ahead: one statement per settlement, and one for them all.
COUNTS = [3, max(_sqlstore.ONE_STATEMENT_FROM, 2) + 1]


def _decide(publish: list[Event]) -> Callable[[Execution, Work], Settlement]:
    def decide(ex: Execution, work: Work) -> Settlement:
        return Settlement(
            end=AttemptEnd(status=ExecutionStatus.COMPLETED, exclusion_confirmed=True),
            work=lambda w: w,
            publish=publish,
        )

    return decide


async def _settle_batch(
    two: tuple[Store, Store], store_url: str, monkeypatch: pytest.MonkeyPatch, count: int
) -> tuple[dict[str, Any], list[int], Any, Any]:
    a, b = two
    claims = [await claimed_known(a, f"w{i}") for i in range(count)]
    by_id = sorted(claims, key=lambda c: c.execution.id)
    publisher, target, stale = by_id[0], by_id[-1], by_id[len(by_id) // 2]
    # Another handle writes one attempt: its holder's copy is stale.
    await b.update_attempt(
        stale.lease, lambda ex: msgspec.structs.replace(ex, recovery={"by": "b"}), now_ms=T0 + 1
    )
    reads = record_batch_sizes(monkeypatch, _sqlstore.READ_AHEAD, att.settle_attempt, 0)
    published = msgspec.structs.replace(
        make_input("published"), work_id=target.work.id, pending=True
    )
    before = (await a.get_work(target.work.id)).pending_inputs
    ended: dict[str, Any] = {}

    async def settle(claim: Any) -> None:
        publish = [published] if claim is publisher else []
        ended[claim.work.id] = await a.settle_attempt(claim.lease, _decide(publish), now_ms=T0 + 2)

    syncs = _syncs_reading_ahead(monkeypatch, store_url)
    async with anyio.create_task_group() as tg:
        for claim in claims:
            tg.start_soon(settle, claim)
    if store_url.startswith("postgresql"):
        assert syncs == [1], f"not one round trip for the batch's reads: {syncs}"
    assert all(e.status is ExecutionStatus.COMPLETED for e in ended.values())
    after = (await a.get_work(target.work.id)).pending_inputs
    return {"before": before, "after": after}, reads, stale, a


def _syncs_reading_ahead(monkeypatch: pytest.MonkeyPatch, store_url: str) -> list[int]:
    """The round trips each read ahead takes from now on (PostgreSQL)."""
    trips: list[int] = []
    if not store_url.startswith("postgresql"):
        return trips
    counted = count_syncs(monkeypatch)
    read, run = _sqlstore.READ_AHEAD[att.settle_attempt]

    def reading(cx: Any, calls: list[Any]) -> Any:
        before = counted[0]
        try:
            return read(cx, calls)
        finally:
            trips.append(counted[0] - before)

    monkeypatch.setitem(_sqlstore.READ_AHEAD, att.settle_attempt, (reading, run))
    return trips


@pytest.mark.parametrize("count", COUNTS)
async def test_a_batch_of_settlements_reads_ahead_each_as_if_alone(
    two: tuple[Store, Store], store_url: str, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    counts, reads, stale, a = await _settle_batch(two, store_url, monkeypatch, count)
    if store_url.startswith("postgresql"):
        assert reads == [count], f"not one read for the batch's settlements: {reads}"
    else:
        assert reads == []  # SQLite runs in process: each reads its own
    assert counts["after"] == counts["before"] + 1, "the input published in the batch was lost"
    kept = await a.get_execution(stale.execution.id)
    assert kept.recovery == {"by": "b"}, "a stale copy overwrote the newer attempt row"
    assert kept.status is ExecutionStatus.COMPLETED


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_postgres_negative_control_settles_from_a_stale_read(
    two: tuple[Store, Store], store_url: str, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    """Settling from the read-ahead Work even after the batch wrote it loses the input."""

    def careless(cx: Any, ahead: Any, lease: Any, decide: Any, now_ms: int, consumed: Any = (),
                 known: Any = None) -> Execution:  # fmt: skip
        return att._settle_known(cx, known.execution, ahead.work_data, decide, now_ms, consumed)

    read, _ = _sqlstore.READ_AHEAD[att.settle_attempt]
    monkeypatch.setitem(_sqlstore.READ_AHEAD, att.settle_attempt, (read, careless))
    counts, reads, _, _ = await _settle_batch(two, store_url, monkeypatch, count)
    assert reads == [count]
    assert counts["after"] == counts["before"], "the control did not reproduce the lost input"
