"""The process census: the scans in flight share one walk of the process table, each judged as a
scan alone judges.

Real processes throughout (no mock of psutil): many concurrent stops and recoveries of real shell
jobs are answered by a few walks and leave nothing running; the matching rules of a stop's scan
and of a recovery's marker scan select exactly the processes they always did; the gathering
answers every caller, a cancelled one included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from conduit_core.extension import OperationError, StopTarget
from conduit_executors_shell import ShellExecutor
from conduit_executors_shell._census import ProcessCensus, ProcessQuery, processes_matching
from conduit_executors_shell._launch import EXECUTION_TAG, LAUNCH_MARKER
from conduit_executors_shell._processes import CREATE_TIME_TOLERANCE
from tests.shell._harness import (
    FileCallbacks,
    env_without_conduit,
    is_running,
    make_context,
    tagged_processes,
    wait_until,
)

pytestmark = pytest.mark.anyio

JOBS = 20


# --- many real jobs at once --------------------------------------------------------------------


async def _launch(executor: ShellExecutor, tmp_path: Path, n: int) -> dict[str, Any]:
    ctx, callbacks = make_context(
        tmp_path, {"command": "sleep 60 & sleep 60", "stop_grace_seconds": 5},
        callbacks=FileCallbacks(tmp_path / f"job-{n}.json"),
    )  # fmt: skip
    handle = await executor.run(ctx)
    recovery = callbacks.recorded()
    assert recovery is not None
    return {"execution_id": ctx.execution_id, "recovery": recovery, "handle": handle,
            "config": dict(ctx.config)}  # fmt: skip


async def test_concurrent_stops_share_few_walks_and_leave_nothing_running(tmp_path: Path) -> None:
    executor = ShellExecutor()
    jobs = [await _launch(executor, tmp_path, n) for n in range(JOBS)]
    for job in jobs:
        wait_until(lambda job=job: len(tagged_processes(job["execution_id"])) >= 2, "the job")
    evidence: dict[str, Any] = {}

    async def stop(job: dict[str, Any]) -> None:
        target = StopTarget(
            execution_id=job["execution_id"], epoch=1, work_id="work-1", config=job["config"],
            recovery=job["recovery"],
        )  # fmt: skip
        evidence[job["execution_id"]] = await executor.stop(target)

    async with anyio.create_task_group() as tg:
        for job in jobs:
            tg.start_soon(stop, job)

    assert all(e.verified for e in evidence.values()), [e.detail for e in evidence.values()]
    for job in jobs:
        assert tagged_processes(job["execution_id"]) == [], "stopped, verified by looking"
    census = executor._census
    # Each stop scans at least twice (what to signal, then whether it is gone).
    assert census.scans >= 2 * JOBS
    assert census.looks <= census.scans // 4, (census.looks, census.scans)


async def test_concurrent_recoveries_share_few_marker_walks(tmp_path: Path) -> None:
    """Wrappers gone, the jobs' processes still running: each recovery scans for its marker."""
    first = ShellExecutor()
    jobs = [await _launch(first, tmp_path, n) for n in range(JOBS)]
    try:
        for job in jobs:
            wait_until(lambda job=job: len(tagged_processes(job["execution_id"])) >= 2, "the job")
            os.kill(job["recovery"]["process"]["pid"], signal.SIGKILL)
            with pytest.raises(OperationError, match="without recording an exit status"):
                await job["handle"].wait()  # reaps the wrapper
        successor = ShellExecutor()
        outcomes: dict[str, str | None] = {}

        async def recover(job: dict[str, Any]) -> None:
            ctx, _ = make_context(
                tmp_path, job["config"], execution_id=job["execution_id"], epoch=2,
                recovery=job["recovery"],
                callbacks=FileCallbacks(tmp_path / f"{job['execution_id']}-recovered.json"),
            )  # fmt: skip
            try:
                await successor.recover(ctx)
            except OperationError as exc:
                outcomes[job["execution_id"]] = exc.code

        async with anyio.create_task_group() as tg:
            for job in jobs:
                tg.start_soon(recover, job)

        # The marker scan found each job's orphans: nobody can tell, each attempt is held.
        assert outcomes == {job["execution_id"]: "recovery_ambiguous" for job in jobs}
        census = successor._census
        assert census.scans == JOBS
        assert census.looks <= 3, census.looks
    finally:
        for job in jobs:
            for process in tagged_processes(job["execution_id"]):
                with contextlib.suppress(psutil.Error):
                    process.kill()


# --- the matching rules ------------------------------------------------------------------------


def _spawn(env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], env=env_without_conduit() | (env or {}), **popen)


def _ctime(pid: int) -> float:
    return psutil.Process(pid).create_time()


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()


_WRAPPER = (
    "import subprocess, time\n"
    "in_group = subprocess.Popen(['sleep', '60'])\n"
    "in_session = subprocess.Popen(['sleep', '60'], process_group=0)\n"
    "zombie = subprocess.Popen(['true'])  # never reaped\n"
    "print(in_group.pid, in_session.pid, zombie.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_shared_walk_selects_what_each_rule_selects_alone(
    started: list[subprocess.Popen[bytes]],
) -> None:
    marker = "exec-census/1/00000000000000aa"
    # Carries the job's marker but started before the wrapper: it cannot be the job's. The pause
    # puts it outside the create-time tolerance.
    early = _spawn({LAUNCH_MARKER: marker})
    started.append(early)
    time.sleep(CREATE_TIME_TOLERANCE + 0.2)
    # Leads its session and group, as a job's wrapper does; its children are the job's.
    wrapper = subprocess.Popen(
        [sys.executable, "-c", _WRAPPER], stdout=subprocess.PIPE, env=env_without_conduit(),
        start_new_session=True,
    )  # fmt: skip
    assert wrapper.stdout is not None
    in_group, in_session, zombie = map(int, wrapper.stdout.readline().split())
    processes = {
        "early, marked": early.pid,
        "wrapper": wrapper.pid,
        "in the group": in_group,
        "in the session, another group": in_session,
        "zombie in the group": zombie,
        "marked, outside the group": _started(started, {LAUNCH_MARKER: marker}),
        "tagged with the execution": _started(started, {EXECUTION_TAG: "exec-census"}),
        "a marker naming the execution": _started(
            started, {LAUNCH_MARKER: "exec-census/1/00000000000000bb"}
        ),
        "another marker": _started(started, {LAUNCH_MARKER: "exec-other/1/00000000000000aa"}),
    }
    try:
        wait_until(lambda: _status(zombie) == psutil.STATUS_ZOMBIE, "the zombie")
        assert os.getsid(in_session) == wrapper.pid != os.getpgid(in_session)
        after = _ctime(wrapper.pid) - CREATE_TIME_TOLERANCE
        assert _ctime(early.pid) < after
        queries = {
            "stop, group trusted, marker": ProcessQuery(
                created_after=after, group=wrapper.pid, marker=marker, execution_id="exec-census"
            ),
            "stop, group not trusted, marker": ProcessQuery(
                created_after=after, marker=marker, execution_id="exec-census"
            ),
            "stop, no marker known": ProcessQuery(created_after=after, execution_id="exec-census"),
            "recovery's marker scan": ProcessQuery.marked(marker),
        }
        ours = {pid: name for name, pid in processes.items()}
        shared = processes_matching(list(queries.values()))
        selected = {
            name: sorted(ours[p.pid] for p in found if p.pid in ours)
            for name, found in zip(queries, shared, strict=True)
        }
        alone = {
            name: sorted(ours[p.pid] for p in processes_matching([query])[0] if p.pid in ours)
            for name, query in queries.items()
        }
        assert selected == alone
        assert selected == {
            "stop, group trusted, marker": sorted(
                [
                    "wrapper",
                    "in the group",
                    "in the session, another group",
                    "marked, outside the group",
                ]
            ),
            "stop, group not trusted, marker": ["marked, outside the group"],
            # Any marker naming the execution counts when the launch's own is not known.
            "stop, no marker known": sorted(
                [
                    "tagged with the execution",
                    "a marker naming the execution",
                    "marked, outside the group",
                ]
            ),
            "recovery's marker scan": sorted(["early, marked", "marked, outside the group"]),
        }
        # The answers are the walk's own objects: psutil's pid-reuse check guards a signal.
        assert all(isinstance(p, psutil.Process) for found in shared for p in found)
    finally:
        for group in (wrapper.pid, in_session):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        wrapper.wait()
        wrapper.stdout.close()


def _started(started: list[subprocess.Popen[bytes]], env: dict[str, str]) -> int:
    process = _spawn(env, start_new_session=True)
    started.append(process)
    return process.pid


def _status(pid: int) -> str | None:
    try:
        status: str = psutil.Process(pid).status()
        return status
    except psutil.Error:
        return None


def test_the_scanning_process_never_finds_itself(tmp_path: Path) -> None:
    """A daemon started from a job's environment carries its marker: it must not stop itself."""
    marker = "exec-self/1/00000000000000cc"
    other = _spawn({LAUNCH_MARKER: marker}, start_new_session=True)
    script = (
        "import os\n"
        "from conduit_executors_shell._census import ProcessQuery, processes_matching\n"
        f"found = processes_matching([ProcessQuery.marked({marker!r})])[0]\n"
        "print(sorted(p.pid for p in found))\n"
        "print(os.getpid())\n"
    )
    try:
        env = os.environ | {LAUNCH_MARKER: marker}
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, check=True, text=True
        ).stdout.split("\n")
        assert out[0] == f"[{other.pid}]", out
        assert int(out[1]) != other.pid
    finally:
        other.kill()
        other.wait()


# --- the gathering -------------------------------------------------------------------------


class _RecordingLook:
    """A look that records each batch."""

    def __init__(self) -> None:
        self.batches: list[list[str | None]] = []

    def __call__(self, queries: Sequence[ProcessQuery]) -> list[list[psutil.Process]]:
        self.batches.append([q.marker for q in queries])
        own = psutil.Process()
        return [[own] if q.marker == "ours" else [] for q in queries]


async def test_scans_asked_together_share_one_look() -> None:
    look = _RecordingLook()
    census = ProcessCensus(look)
    answers: dict[int, int] = {}

    async def ask(n: int) -> None:
        found = await census.processes(ProcessQuery.marked("ours" if n % 2 else f"m{n}"))
        answers[n] = len(found)

    async with anyio.create_task_group() as tg:
        for n in range(50):
            tg.start_soon(ask, n)

    assert len(look.batches) == 1
    assert (census.looks, census.scans) == (1, 50)
    assert answers == {n: n % 2 for n in range(50)}


async def test_a_failing_look_lets_each_scan_walk_alone(
    started: list[subprocess.Popen[bytes]],
) -> None:
    marker = "exec-fail/1/00000000000000dd"
    marked = _spawn({LAUNCH_MARKER: marker}, start_new_session=True)
    started.append(marked)
    wait_until(lambda: is_running(marked.pid), "the marked process")
    calls: list[int] = []

    def failing_once(queries: Sequence[ProcessQuery]) -> list[list[psutil.Process]]:
        calls.append(len(queries))
        if len(calls) == 1:
            raise OSError("no /proc")
        return [[] for _ in queries]

    census = ProcessCensus(failing_once)
    results: list[list[int]] = []

    async def ask() -> None:
        results.append([p.pid for p in await census.processes(ProcessQuery.marked(marker))])

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(ask)
    # Each found the process by a walk of its own, as without the census.
    assert results == [[marked.pid]] * 3
    assert calls == [3]
    assert await census.processes(ProcessQuery.marked(marker)) == []  # the next look works
    assert calls == [3, 1]
