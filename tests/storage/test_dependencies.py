"""Dependencies at the store: what a claim sees of waiting Work, the settlement in the
transaction that ends the dependency, and a dependent's submit racing its dependency's end on
two handles (real concurrent transactions on PostgreSQL)."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from conduit_core.errors import ConduitError
from conduit_core.model import Dependencies, DependencyFailure, Work, WorkKind, WorkStatus
from conduit_core.storage import Claim, Store
from conduit_core.storage.conformance import (
    LEASE_MS,
    T0,
    StoreFactory,
    make_input,
    snapshot,
)

pytestmark = pytest.mark.anyio


def _work(
    work_id: str, *after: str, on_failure: DependencyFailure = DependencyFailure.CANCEL
) -> Work:
    deps = Dependencies(after=list(after), on_failure=on_failure) if after else None
    return Work(id=work_id, scope="root", binding="b", kind=WorkKind.TASK, created_at_ms=T0,
                updated_at_ms=T0, dependencies=deps)  # fmt: skip


async def _claimed(store: Store) -> list[str]:
    claims = await store.claim_ready(
        limit=50, snapshot_for=lambda w: snapshot(), owner="o", now_ms=T0, lease_ms=LEASE_MS
    )
    return sorted(c.work.id for c in claims if isinstance(c, Claim))


async def test_waiting_work_is_not_read_by_claims_until_released(store: Store) -> None:
    await store.create_works([
        (_work("a"), make_input("a")),
        (_work("b", "a"), make_input("b")),
        (_work("c", "a", "b", on_failure=DependencyFailure.RUN), make_input("c")),
    ])  # fmt: skip
    assert (await store.work_counts())["startable"] == 1
    assert await _claimed(store) == ["a"]
    assert (await store.get_work("a")).has_dependents
    await store.cancel_work("a", now_ms=T0 + 5)
    b = await store.get_work("b")
    assert b.status is WorkStatus.CANCELLED
    assert b.dependencies is not None
    assert b.dependencies.failed == "a"
    c = await store.get_work("c")  # run: both ended (a cancelled, b cancelled by a)
    assert c.dependencies is not None
    assert c.dependencies.waiting_for == []
    assert await _claimed(store) == ["c"]


async def test_refused_submit_writes_nothing(store: Store) -> None:
    with pytest.raises(ConduitError) as caught:
        await store.create_work(_work("x", "nowhere"), first_input=make_input("x"))
    assert caught.value.code == "dependency_unknown"
    results = await store.create_works([
        (_work("p", "q"), make_input("p")), (_work("q", "p"), make_input("q")),
        (_work("ok"), make_input("ok")),
    ])  # fmt: skip
    assert [r.code if isinstance(r, ConduitError) else r.id for r in results] == [
        "dependency_cycle", "dependency_cycle", "ok",
    ]  # fmt: skip
    assert [w.id for w in await store.list_work(limit=10)] == ["ok"]
    with pytest.raises(LookupError):
        await store.get_event("ev-x")
    with pytest.raises(LookupError):
        await store.get_event("ev-p")


async def test_submit_racing_the_dependency_end_never_strands_a_dependent(
    store_factory: StoreFactory,
) -> None:
    """One handle submits dependents of ``x`` while the other cancels ``x``: whichever
    commits first, every dependent is decided (cancelled), none waits for an ended Work."""
    one, two = await store_factory.open(), await store_factory.open()
    try:
        for round_ in range(15):
            x = f"x{round_}"
            await one.create_work(_work(x), first_input=make_input(x))
            dependents = [f"{x}-d{i}" for i in range(4)]

            async def submit(ids: list[str] = dependents, x: str = x) -> None:
                for work_id in ids:
                    await one.create_work(_work(work_id, x), first_input=make_input(work_id))

            async def cancel(x: str = x) -> None:
                await two.cancel_work(x, now_ms=T0 + 1)

            async with anyio.create_task_group() as tg:
                tg.start_soon(submit)
                tg.start_soon(cancel)
            for work_id in dependents:
                work = await two.get_work(work_id)
                assert work.status is WorkStatus.CANCELLED, (work_id, work)
        assert (await two.work_counts())["startable"] == 0
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_work_without_after_stores_no_dependency_fields(store: Store) -> None:
    await store.create_work(_work("plain"), first_input=make_input("plain"))
    work = await store.get_work("plain")
    assert work.dependencies is None
    assert not work.has_dependents
    encoded = msgspec.json.encode(work)
    assert b'"dependencies":null' in encoded


async def test_a_long_chain_in_one_batch_in_any_order(store: Store) -> None:
    """A thousand items, each after the one before, listed last first: one pass in dependency
    order links them all (no recursion, no pass per item); a ring among them is refused."""
    ids = [f"c{i:04d}" for i in range(1000)]
    items = [(_work(ids[0]), make_input(ids[0]))] + [
        (_work(work_id, ids[i]), make_input(work_id)) for i, work_id in enumerate(ids[1:])
    ]
    results = await store.create_works(list(reversed(items)))
    assert all(isinstance(r, Work) for r in results)
    assert await _claimed(store) == [ids[0]]
    ring = [(_work("r1", "r3"), None), (_work("r2", "r1"), None), (_work("r3", "r2"), None)]
    refused = await store.create_works(ring)
    assert [r.code for r in refused if isinstance(r, ConduitError)] == ["dependency_cycle"] * 3
    message = str(refused[0])
    assert "form a cycle" in message
    assert all(name in message for name in ("r1", "r2", "r3"))
