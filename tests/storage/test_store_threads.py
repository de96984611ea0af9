"""The store's worker threads: a cap, warm reuse, anyio's cancellation semantics, a clean stop."""

from __future__ import annotations

import threading

import anyio
import pytest

from conduit_core.storage._threads import StoreThreads

pytestmark = pytest.mark.anyio


async def test_at_most_count_calls_run_at_once_and_every_call_gets_its_own_result() -> None:
    threads = StoreThreads(3, name="t")
    lock = threading.Lock()
    running = [0, 0]  # now, most
    release, three = threading.Event(), threading.Event()

    def call(i: int) -> int:
        with lock:
            running[0] += 1
            running[1] = max(running)
            if running[0] == 3:
                three.set()
        release.wait(10)
        with lock:
            running[0] -= 1
        return i * 2

    results: dict[int, int] = {}

    async def one(i: int) -> None:
        results[i] = await threads.run(lambda: call(i))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
            # The first three run; the others wait for a thread.
            assert await anyio.to_thread.run_sync(three.wait, 10)
            release.set()
    threads.stop()
    assert running[1] == 3
    assert results == {i: i * 2 for i in range(8)}


async def test_calls_one_after_another_run_on_the_thread_that_went_idle_last() -> None:
    threads = StoreThreads(4, name="t")
    names = [await threads.run(lambda: threading.current_thread().name) for _ in range(20)]
    threads.stop()
    assert set(names) == {"t-1"}


async def test_an_error_reaches_its_caller_and_the_thread_serves_on() -> None:
    threads = StoreThreads(1, name="t")

    def refuse() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        await threads.run(refuse)
    assert await threads.run(lambda: "next") == "next"
    threads.stop()


async def test_a_cancelled_caller_waits_for_its_call_to_end() -> None:
    # As anyio.to_thread.run_sync: a write is never left running behind its caller's back.
    threads = StoreThreads(1, name="t")
    started, release = threading.Event(), threading.Event()
    ended: list[str] = []

    def slow() -> str:
        started.set()
        release.wait(10)
        ended.append("call")
        return "done"

    scope = anyio.CancelScope()

    async def caller() -> None:
        with scope:
            try:
                await threads.run(slow)
            finally:
                ended.append("caller")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            await anyio.to_thread.run_sync(started.wait, 10)
            scope.cancel()
            await anyio.sleep(0.05)
            assert ended == []  # cancelled, yet still waiting on its call
            release.set()
    assert ended == ["call", "caller"]
    threads.stop()


async def test_stop_lets_queued_calls_finish_and_ends_the_threads() -> None:
    threads = StoreThreads(2, name="stopping")
    release = threading.Event()
    done: list[int] = []
    served: set[threading.Thread] = set()

    def call(i: int) -> None:
        served.add(threading.current_thread())
        release.wait(10)
        done.append(i)

    async def one(i: int) -> None:
        await threads.run(lambda: call(i))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(one, i)
            await anyio.sleep(0.05)
            threads.stop()  # two calls running, three waiting for them
            release.set()
    assert sorted(done) == [0, 1, 2, 3, 4]
    assert len(served) == 2
    for thread in served:
        await anyio.to_thread.run_sync(thread.join, 10)
        assert not thread.is_alive()
    # A call after stop starts a new set of threads.
    assert await threads.run(lambda: "again") == "again"
    threads.stop()
