"""Group commit: concurrent writes share transactions without sharing their failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.model import Event, Work
from conduit_core.storage import Store, _sqlstore, open_store
from conduit_core.storage._sql import Cx
from conduit_core.storage._threads import StoreThreads

pytestmark = pytest.mark.anyio


def _work(i: int) -> Work:
    return Work(id=f"g{i}", scope="root", binding="b", created_at_ms=1, updated_at_ms=1)


@pytest.fixture
def sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch the stores opened from now on run."""
    sizes: list[int] = []
    original = _sqlstore.SqlStore._run_batch

    def counting(self: _sqlstore.SqlStore, ops: list) -> None:  # type: ignore[type-arg]
        sizes.append(len(ops))
        original(self, ops)

    monkeypatch.setattr(_sqlstore.SqlStore, "_run_batch", counting)
    return sizes


async def test_one_refused_write_does_not_undo_its_batch_neighbours(
    store_url: str, sizes: list[int]
) -> None:
    store: Store
    async with await open_store(store_url) as store:
        outcomes: dict[int, object] = {}

        async def write(i: int) -> None:
            try:
                if i % 5 == 0:  # input for Work that does not exist: refused
                    ev = Event(id=f"x{i}", delivery_id=f"x{i}", type="t", work_id="nope",
                               pending=True, accepted_at_ms=1)  # fmt: skip
                    outcomes[i] = await store.accept_event(ev)
                else:
                    outcomes[i] = await store.create_work(_work(i))
            except ConduitError as exc:
                outcomes[i] = exc

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(write, i)
        assert max(sizes) > 1, "concurrent writes should have shared a transaction"
        for i in range(40):
            if i % 5 == 0:
                assert isinstance(outcomes[i], NotFoundError)
            else:
                assert (await store.get_work(f"g{i}")).id == f"g{i}"
        # Nothing of the refused writes was kept.
        with pytest.raises(NotFoundError):
            await store.get_event("x0")


async def test_a_cancelled_caller_whose_write_never_ran_leaves_nothing(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first batch is held in its worker thread while every other caller is queued behind
    # it; then all callers are cancelled. The held batch commits whole; the queued writes never
    # run — not then, and not later inside someone else's batch (the negative control: leave a
    # cancelled operation in the queue and the final write's batch commits it, failing below).
    batches: list[int] = []
    running, go = threading.Event(), threading.Event()
    original = _sqlstore.SqlStore._run_batch

    def held_first(self: _sqlstore.SqlStore, ops: list) -> None:  # type: ignore[type-arg]
        batches.append(len(ops))
        if len(batches) == 1:
            running.set()
            go.wait(30)
        original(self, ops)

    monkeypatch.setattr(_sqlstore.SqlStore, "_run_batch", held_first)
    async with await open_store(store_url) as store:
        batches.clear()  # opening the store wrote too
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.create_work, _work(0))
            assert await anyio.to_thread.run_sync(running.wait, 30)
            for i in range(1, 40):
                tg.start_soon(store.create_work, _work(i))
            await anyio.lowlevel.checkpoint()  # let every caller queue behind the held batch
            tg.cancel_scope.cancel()
            go.set()
        stored = {w.id for w in await store.list_work(limit=100)}
        assert len(stored) == sum(batches) < 40  # the batches that ran, whole; no queued write
        await store.create_work(_work(99))
        after = {w.id for w in await store.list_work(limit=100)}
        assert after == stored | {"g99"}


def test_a_waiter_whose_write_another_leader_took_waits_instead_of_spinning() -> None:
    """With a lead slot free, a caller whose operation another leader has already taken (a
    lead handed to it after a cancelled leader, then taken by a new submitter) must wait for
    that leader, not lead an empty queue in a loop that never yields: that starved the event
    loop of a daemon recovering a thousand attempts on PostgreSQL. The event loop runs in a
    thread, so the old spin shows as a thread that never finishes."""
    from collections import deque

    from conduit_core.storage._group_commit import GroupCommit, Operation

    taken: list[Operation[object]] = []
    arrived: list[anyio.Event] = []

    class TakenAtOnce(deque):  # type: ignore[type-arg]
        """The queue as another leader leaves it: it takes every operation as it arrives."""

        def append(self, op: Operation[object]) -> None:
            op.taken = True
            taken.append(op)
            arrived[0].set()

    result: list[object] = []

    async def main() -> None:
        group = GroupCommit(lambda ops: None, threads=StoreThreads(2, name="t"), max_parallel=2)
        group._queue = TakenAtOnce()
        group._running = 1  # the other leader
        arrived.append(anyio.Event())

        async def other_leader_finishes() -> None:
            await arrived[0].wait()
            # Running at all means the submitter yielded; the old one spun and never did.
            (op,) = taken
            op.result, op.finished = "written", True
            op.wakeup.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(other_leader_finishes)
            result.append(await group.submit(lambda cx: "unused"))

    runner = threading.Thread(target=anyio.run, args=(main,), daemon=True)
    runner.start()
    runner.join(10)
    assert not runner.is_alive(), "the waiter spun: its event loop never yielded"
    assert result == ["written"]


async def test_writes_left_behind_a_full_batch_run_next_each_with_its_own_result() -> None:
    # Every queued write waits on the queue's one event, which becomes the batch's when a leader
    # takes it: writes left behind a full batch must move to the queue's next event and still be
    # woken with their own result, in arrival order, with no write lost or run twice.
    from conduit_core.storage._group_commit import GroupCommit, Operation

    batches: list[list[int]] = []

    def run_batch(ops: list[Operation[object]]) -> None:
        batches.append([op.fn(None) for op in ops])
        for op in ops:
            op.result = op.fn(None) * 10
        time.sleep(0.2)  # a slow commit, in the worker thread: the event loop should idle

    group = GroupCommit(run_batch, threads=StoreThreads(1, name="t"), max_batch=3)
    results: dict[int, object] = {}

    async def write(i: int) -> None:
        results[i] = await group.submit(lambda cx: i)

    cpu = time.process_time()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(write, i)
    assert batches == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert results == {i: i * 10 for i in range(8)}
    # Waiting costs no CPU: a waiter left on an event already set would spin through the
    # 0.4 s the next two batches take.
    assert time.process_time() - cpu < 0.2


async def test_a_write_that_must_be_alone_of_its_kind_shares_its_batch_with_none_of_it() -> None:
    # Claims of named Work (``alone_of_kind``) share their batch with no other claim; claims from
    # the ready queue (same kind) share theirs with each other. Writes of no kind are batched as
    # ever; what is left stays queued in its order, and each gets its own result.
    from conduit_core.storage._group_commit import GroupCommit, Operation

    batches: list[list[str]] = []

    def run_batch(ops: list[Operation[object]]) -> None:
        batches.append([str(op.fn(None)) for op in ops])
        for op in ops:
            op.result = f"{op.fn(None)}!"

    group = GroupCommit(run_batch, threads=StoreThreads(1, name="t"), max_batch=10)
    results: dict[str, object] = {}

    async def write(name: str) -> None:
        kind = "claim" if name[0] in "rn" else ""
        results[name] = await group.submit(
            lambda cx: name, kind=kind, alone_of_kind=name.startswith("n")
        )

    names = ["s1", "r1", "n1", "r2", "s2", "n2", "s3"]
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(write, name)
    assert batches == [["s1", "r1", "r2", "s2", "s3"], ["n1"], ["n2"]]
    assert results == {name: f"{name}!" for name in names}


async def test_writes_queued_in_the_same_turn_of_the_loop_share_one_transaction(
    store_url: str, sizes: list[int]
) -> None:
    # Eight callers woken together (as an attempt batch's ends wake theirs): the first to find a
    # free batch slot lets the others queue before it leads, so one transaction takes all eight.
    # Without that, the first two led batches of one each (two may run at once on PostgreSQL).
    store: Store
    async with await open_store(store_url) as store:
        sizes.clear()  # opening the store wrote too
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(store.create_work, _work(i))
        assert sizes == [8]
        for i in range(8):
            assert (await store.get_work(f"g{i}")).id == f"g{i}"


async def test_a_batch_without_refusals_sends_no_savepoint_and_one_that_refuses_keeps_the_rest(
    store_url: str,
) -> None:
    # A batch runs without savepoints; an operation that refuses after writing makes the batch
    # run again with savepoints, so its own writes are undone and its neighbours' kept. The
    # negative control: a batch that never rolled back would keep the refused write below.
    statements: list[str] = []
    store: Store
    async with await open_store(store_url) as store:
        assert isinstance(store, _sqlstore.SqlStore)

        def scratch(cx: Cx) -> None:
            cx.run("CREATE TABLE t_batch (id INTEGER PRIMARY KEY)")

        await anyio.to_thread.run_sync(store.transaction, scratch)

        def insert(i: int, refuse: bool = False) -> Callable[[Cx], int]:
            def op(cx: Cx) -> int:
                statements.append(f"insert {i}")
                cx.run("INSERT INTO t_batch (id) VALUES (?)", (i,))
                if refuse:
                    raise ValueError(f"refused {i} after writing")
                return i

            return op

        outcomes: dict[int, object] = {}

        async def submit(i: int, refuse: bool = False) -> None:
            try:
                outcomes[i] = await store._group.submit(insert(i, refuse))
            except ValueError as exc:
                outcomes[i] = exc

        # Woken in the same turn of the loop: one batch (see the test above).
        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(submit, i)
        assert outcomes == {0: 0, 1: 1, 2: 2, 3: 3}
        assert statements == ["insert 0", "insert 1", "insert 2", "insert 3"]  # ran once

        statements.clear()
        async with anyio.create_task_group() as tg:
            tg.start_soon(submit, 11)
            tg.start_soon(submit, 12, True)
            tg.start_soon(submit, 13)
        assert isinstance(outcomes[12], ValueError)
        assert (outcomes[11], outcomes[13]) == (11, 13)
        # Run without savepoints up to the refusal, then again whole with them.
        assert statements == ["insert 11", "insert 12", "insert 11", "insert 12", "insert 13"]

        def ids(cx: Cx) -> list[int]:
            return [r[0] for r in cx.rows("SELECT id FROM t_batch ORDER BY id")]

        assert await anyio.to_thread.run_sync(store.transaction, ids) == [0, 1, 2, 3, 11, 13]


async def test_writes_queued_in_one_turn_cost_one_turn_of_the_loop_between_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first caller yields once to let the others queue; the others see it gathering and
    # wait for its batch at once. Each taking a turn of the loop of its own cost ~6 µs per
    # write, three times per attempt.
    from conduit_core.storage._group_commit import GroupCommit

    turns = 0
    checkpoint = anyio.lowlevel.checkpoint

    async def counted() -> None:
        nonlocal turns
        turns += 1
        await checkpoint()

    monkeypatch.setattr(anyio.lowlevel, "checkpoint", counted)
    batches: list[int] = []
    group = GroupCommit(
        lambda ops: batches.append(len(ops)), threads=StoreThreads(1, name="t"), max_parallel=2
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(32):
                tg.start_soon(group.submit, lambda cx, i=i: i)
    assert batches == [32]
    assert turns == 1


async def test_a_gathering_caller_cancelled_hands_the_lead_to_the_writes_it_was_gathering() -> None:
    # Writes queued while a caller gathers wait for it to lead. Cancelled in its turn, it must
    # hand the lead on, or they wait for ever.
    from conduit_core.storage._group_commit import GroupCommit

    ran: list[list[str]] = []

    def run_batch(ops: list) -> None:  # type: ignore[type-arg]
        ran.append([op.fn(None) for op in ops])
        for op in ops:
            op.result = op.fn(None)

    group = GroupCommit(run_batch, threads=StoreThreads(1, name="t"), max_parallel=2)
    scopes: list[anyio.CancelScope] = []
    results: list[object] = []

    async def gatherer() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await group.submit(lambda cx: "cancelled")

    async def writer(name: str) -> None:
        results.append(await group.submit(lambda cx: name))

    async def cancel_the_gatherer() -> None:
        scopes[0].cancel()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(gatherer)  # first: it gathers, yielding its turn
            tg.start_soon(writer, "b")
            tg.start_soon(writer, "c")
            tg.start_soon(cancel_the_gatherer)  # runs in that turn, before it leads
    assert ran == [["b", "c"]]
    assert sorted(results) == ["b", "c"]
