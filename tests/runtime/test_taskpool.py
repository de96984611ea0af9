"""TaskPool: calls reuse idle tasks, and behave as tasks of their own in the group."""

from __future__ import annotations

import anyio
import pytest

from conduit_core.runtime import TaskPool

pytestmark = pytest.mark.anyio


async def test_calls_one_after_another_run_on_one_task_and_close_lets_the_group_end() -> None:
    seen: list[int] = []

    async def call() -> None:
        seen.append(anyio.get_current_task().id)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            pool = TaskPool(tg)
            for _ in range(5):
                pool.start_soon(call)
                await anyio.wait_all_tasks_blocked()
            pool.close()  # without it the group would wait for the idle task for ever
    assert len(seen) == 5
    assert len(set(seen)) == 1


async def test_calls_at_once_each_get_a_task_and_later_calls_reuse_them() -> None:
    release = anyio.Event()
    first: list[int] = []
    later: list[int] = []

    async def blocked() -> None:
        first.append(anyio.get_current_task().id)
        await release.wait()

    async def quick() -> None:
        later.append(anyio.get_current_task().id)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            pool = TaskPool(tg, max_idle=2)
            for _ in range(3):
                pool.start_soon(blocked)
            await anyio.wait_all_tasks_blocked()
            release.set()
            await anyio.wait_all_tasks_blocked()
            for _ in range(3):
                pool.start_soon(quick)
            await anyio.wait_all_tasks_blocked()
            pool.close()
    assert len(set(first)) == 3
    # Two of the three stayed idle (max_idle=2) and took two calls; the third got a new task.
    assert len(set(later) & set(first)) == 2
    assert len(set(later)) == 3


async def test_an_error_in_a_call_ends_the_group_as_start_soon_would() -> None:
    cancelled: list[str] = []

    async def waits() -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append("other")
            raise

    async def fails() -> None:
        raise ValueError("the call failed")

    with anyio.fail_after(10), pytest.RaisesGroup(pytest.RaisesExc(ValueError, match="failed")):
        async with anyio.create_task_group() as tg:
            pool = TaskPool(tg)
            pool.start_soon(waits)
            await anyio.wait_all_tasks_blocked()
            pool.start_soon(fails)
    assert cancelled == ["other"]


async def test_a_call_handed_over_as_the_group_is_cancelled_still_runs_its_cleanup() -> None:
    # As a task started into a cancelled group: it runs to its first checkpoint, is cancelled
    # there, and its cleanup runs (the host's attempt cleanup depends on it).
    ran: list[str] = []

    async def first() -> None:
        pass

    async def handed() -> None:
        ran.append("began")
        try:
            await anyio.sleep_forever()
        finally:
            ran.append("cleanup")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            pool = TaskPool(tg)
            pool.start_soon(first)
            await anyio.wait_all_tasks_blocked()  # its task is idle now
            tg.cancel_scope.cancel()
            pool.start_soon(handed)
    assert ran == ["began", "cleanup"]
