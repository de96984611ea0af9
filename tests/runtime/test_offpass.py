"""ExecutorCalls (the daemon's stops and control dispatches off the pass): one call per key at a
time, its own deadline, a backoff after a failure, and nothing left running after the host."""

from __future__ import annotations

import anyio
import pytest

from conduit_core.daemon._offpass import ExecutorCalls
from conduit_core.errors import ConduitError

pytestmark = pytest.mark.anyio


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_hung_call_holds_only_its_own_key_and_fails_at_its_deadline() -> None:
    clock = _Clock()
    calls = ExecutorCalls(backoff_initial_s=1.0, backoff_max_s=4.0, clock=clock)
    hung_started = 0
    others: list[str] = []
    gave_up = anyio.Event()

    async def hung() -> str | None:
        nonlocal hung_started
        hung_started += 1
        try:
            await anyio.sleep_forever()
        finally:
            gave_up.set()
        return None  # pragma: no cover

    async def deadline_passes() -> None:
        nonlocal gave_up
        await gave_up.wait()
        await anyio.wait_all_tasks_blocked()  # the call's task records why it failed
        gave_up = anyio.Event()

    async def other(name: str) -> str | None:
        others.append(name)
        return None

    with anyio.fail_after(10):
        async with calls.running():
            assert calls.start("stop:a", "stop a", hung, deadline_s=0.2)
            await anyio.wait_all_tasks_blocked()
            # Passes go on: the same key is not started again, other keys run at once.
            assert not calls.start("stop:a", "stop a", hung, deadline_s=0.2)
            assert calls.start("stop:b", "stop b", lambda: other("b"), deadline_s=0.2)
            await anyio.wait_all_tasks_blocked()
            assert others == ["b"]
            assert "under way" in (calls.state("stop:a") or "")
            await deadline_passes()
            assert calls.state("stop:a") == "try 1 failed: did not finish within 0.2 s"
            assert calls.state("stop:b") is None
            # Backing off: not before 1 s, then again (and the backoff doubles).
            assert not calls.start("stop:a", "stop a", hung, deadline_s=0.2)
            clock.now += 1.0
            assert calls.start("stop:a", "stop a", hung, deadline_s=0.2)
            await deadline_passes()
            assert (calls.state("stop:a") or "").startswith("try 2 failed")
            clock.now += 1.5
            assert not calls.start("stop:a", "stop a", hung, deadline_s=0.2)
    assert hung_started == 2


async def test_a_failure_is_kept_until_a_call_succeeds_or_the_key_is_dropped() -> None:
    clock = _Clock()
    calls = ExecutorCalls(clock=clock)
    outcomes: list[str | None] = ["not verified", None]

    async def flaky() -> str | None:
        return outcomes.pop(0)

    async def raises() -> str | None:
        raise ConduitError("no such program", code="executor_unavailable")

    with anyio.fail_after(10):
        async with calls.running():
            calls.start("stop:a", "stop a", flaky, deadline_s=5)
            calls.start("stop:c", "stop c", raises, deadline_s=5)
            await anyio.wait_all_tasks_blocked()
            assert calls.state("stop:a") == "try 1 failed: not verified"
            assert calls.state("stop:c") == "try 1 failed: [executor_unavailable] no such program"
            clock.now += 10
            calls.start("stop:a", "stop a", flaky, deadline_s=5)
            await anyio.wait_all_tasks_blocked()
            assert calls.state("stop:a") is None  # done: nothing kept
            calls.keep_only("stop:", ["stop:a"])  # c was settled some other way
            assert calls.state("stop:c") is None


async def test_leaving_cancels_the_calls_still_running() -> None:
    calls = ExecutorCalls()
    ended = anyio.Event()

    async def hung() -> str | None:
        try:
            await anyio.sleep_forever()
        finally:
            ended.set()
        return None  # pragma: no cover

    with anyio.fail_after(5):
        async with calls.running():
            calls.start("stop:a", "stop a", hung, deadline_s=3600)
            await anyio.wait_all_tasks_blocked()
        assert ended.is_set()
        assert not calls.start("stop:a", "stop a", hung, deadline_s=1)  # no host: nothing starts
