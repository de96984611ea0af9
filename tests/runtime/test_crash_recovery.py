"""A scheduler process killed with SIGKILL mid-run; another process recovers every attempt.

Real parts: the store on each backend, the shell executor's detached process groups, and a
real ``kill -9`` of the scheduler process. Every job appends to a side-effect file when it
starts, so a job run twice (a relaunch of something that was running) would show.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

from conduit_core.config import Binding
from conduit_core.model import Event, ExecutionStatus, Work, WorkStatus
from conduit_core.plugins import Plugins
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
from conduit_core.storage import open_store

pytestmark = pytest.mark.anyio

N = 5
LEASE_MS = 1500

CHILD = textwrap.dedent(
    """
    import sys, anyio
    from conduit_core.config import Binding
    from conduit_core.plugins import Plugins
    from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
    from conduit_core.storage import open_store

    url, state_dir, command = sys.argv[1], sys.argv[2], sys.argv[3]

    async def main():
        store = await open_store(url)
        sched = Scheduler(store, SystemClock(), Plugins.load(disabled=()), SchedulerOptions(
            owner="doomed", lease_ms=int(sys.argv[4]), job_concurrency=16, state_dir=state_dir,
            bindings={"job": Binding(executor="shell", config={"command": command})},
        ))
        async with sched.keeping_leases(), anyio.create_task_group() as tg:
            claims, _ = await sched.claim_ready(100)
            for claim in claims:
                tg.start_soon(sched.run_attempt, claim)
            print("claimed", len(claims), flush=True)

    anyio.run(main)
    """
)


def _command(side_effects: Path, release: Path) -> str:
    # Record the start, then wait (bounded) for the test to let the job finish.
    return (
        f'echo "start $CONDUIT_WORK_ID" >> {side_effects}; '
        f"for i in $(seq 1 300); do [ -e {release} ] && break; sleep 0.1; done; "
        f'echo "end $CONDUIT_WORK_ID" >> {side_effects}'
    )


async def test_sigkilled_scheduler_attempts_are_recovered_once_each(
    store_url: str, tmp_path: Path
) -> None:
    side_effects = tmp_path / "side-effects.log"
    release = tmp_path / "release"
    state_dir = tmp_path / "state"
    command = _command(side_effects, release)
    async with await open_store(store_url) as store:
        now = SystemClock().now_ms()
        for i in range(N):
            wid = f"crash{i}"
            work = Work(id=wid, scope="root", binding="job", created_at_ms=now, updated_at_ms=now)
            first = Event(id=f"{wid}/in", delivery_id=f"{wid}/in", type="input", work_id=wid,
                          pending=True, accepted_at_ms=now)  # fmt: skip
            await store.create_work(work, first_input=first)

    child = subprocess.Popen(  # noqa: ASYNC220 - started once, killed below; never awaited
        [sys.executable, "-c", CHILD, store_url, str(state_dir), command, str(LEASE_MS)],
        stdout=subprocess.DEVNULL,
    )
    try:
        # Kill once every job runs and its launch is acknowledged (recovery metadata stored).
        # A kill between a job's start and that write is the uncertain-launch case: recovery
        # then fails closed, which tests/runtime/test_recovery.py covers.
        deadline = time.monotonic() + 60
        async with await open_store(store_url) as watcher:
            while True:
                running = [e for e in await watcher.live_executions() if e.recovery is not None]
                started = side_effects.exists() and side_effects.read_text().count("start") == N
                if started and len(running) == N:
                    break
                assert child.poll() is None, "the scheduler process died on its own"
                assert time.monotonic() < deadline, "the jobs never all started"
                await anyio.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)  # the daemon dies; its detached jobs keep running
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()

    async with await open_store(store_url) as store:
        sched = Scheduler(
            store, SystemClock(), Plugins.load(disabled=()),
            SchedulerOptions(
                owner="survivor", lease_ms=LEASE_MS, job_concurrency=16, state_dir=str(state_dir),
                bindings={"job": Binding(executor="shell", config={"command": command})},
            ),
        )  # fmt: skip
        claims = []
        with anyio.fail_after(30):
            while len(claims) < N:  # leases of the killed process expire, then recovery claims
                claims += await sched.recover_expired()
                await anyio.sleep(0.1)
        assert {c.execution.epoch for c in claims} == {2}
        release.touch()
        results = []
        async with sched.keeping_leases(), anyio.create_task_group() as tg:

            async def recover(claim) -> None:  # type: ignore[no-untyped-def]
                results.append(await sched.run_recovery(claim))

            for claim in claims:
                tg.start_soon(recover, claim)
        assert len(results) == N
        for execution in results:
            assert execution.status is ExecutionStatus.COMPLETED, execution.failure_message
            assert not execution.segments[-1].relaunched  # adopted, never run again
            assert (await store.get_work(execution.work_id)).status is WorkStatus.COMPLETED
    lines = side_effects.read_text().split("\n")
    for i in range(N):
        assert lines.count(f"start crash{i}") == 1, "a job ran twice"
        assert lines.count(f"end crash{i}") == 1
