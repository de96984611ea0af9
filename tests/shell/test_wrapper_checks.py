"""Batched wrapper checks: one look for the recoveries in flight, judged as the single path judges.

Real processes throughout: a live wrapper is adopted, a reused pid (another process, another create
time), a wrapper out of its group and a dead group are refused exactly as the one-by-one check
refuses them (the batch only proves; what it cannot prove takes the single path).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from conduit_core.extension import ExecutionContext, Handle, OperationError
from conduit_executors_shell import ShellExecutor
from conduit_executors_shell._metadata import JobRecord
from conduit_executors_shell._processes import find_wrapper
from conduit_executors_shell._wrapper_checks import WrapperChecks, wrappers_alive
from tests.shell._harness import (
    FileCallbacks,
    make_context,
    tagged_processes,
    wait_until,
    wait_until_async,
)

pytestmark = pytest.mark.anyio


def _record(pid: int, *, pgid: int | None = None, create_time: float | None = None) -> JobRecord:
    real = psutil.Process(pid).create_time() if create_time is None else create_time
    return JobRecord(
        pid=pid, pgid=pid if pgid is None else pgid, create_time=real, workspace="/nowhere",
        launched_at=real,
    )  # fmt: skip


@pytest.fixture
def leaders() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes leading their own session and group, as a job's wrapper does."""
    started = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(4)]
    yield started
    for process in started:
        process.kill()
        process.wait()


def test_the_batch_proves_exactly_what_find_wrapper_proves(
    leaders: list[subprocess.Popen[bytes]],
) -> None:
    live, other, zombie, gone = leaders
    records = {
        "live": _record(live.pid),
        "reused pid (another create time)": _record(other.pid, create_time=_ctime(other) - 1000),
        "create time just outside the tolerance": _record(other.pid, create_time=_ctime(other) + 2),
        "not its group": _record(other.pid, pgid=os.getpgid(0)),
    }
    zombie.kill()
    wait_until(lambda: _status(zombie.pid) == psutil.STATUS_ZOMBIE, "the zombie")
    records["zombie (not reaped)"] = _record(zombie.pid)
    gone_record = _record(gone.pid)
    gone.kill()
    gone.wait()
    records["dead and reaped"] = gone_record
    records["no pid"] = JobRecord(pid=0, pgid=0, create_time=0.0, workspace="/", launched_at=0)

    batch = dict(zip(records, wrappers_alive(list(records.values())), strict=True))
    single = {name: find_wrapper(record) is not None for name, record in records.items()}

    assert batch == single
    assert batch == {
        "live": True,
        "reused pid (another create time)": False,
        "create time just outside the tolerance": False,
        "not its group": False,
        "zombie (not reaped)": True,  # find_wrapper: "as a zombie, even"
        "dead and reaped": False,
        "no pid": False,
    }


def _ctime(process: subprocess.Popen[bytes]) -> float:
    return psutil.Process(process.pid).create_time()


def _status(pid: int) -> str | None:
    try:
        status: str = psutil.Process(pid).status()
        return status
    except psutil.Error:
        return None


# --- recovery: batched vs one by one -----------------------------------------------------------


class _Jobs:
    """Generation 3 jobs launched by one executor, recovered by fresh ones (a restart)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.handles: list[tuple[int, Handle]] = []

    async def launch(self, name: str, command: str) -> dict[str, Any]:
        ctx, callbacks = make_context(
            self.tmp_path, {"command": command},
            callbacks=FileCallbacks(self.tmp_path / f"{name}.json"),
        )  # fmt: skip
        handle = await ShellExecutor().run(ctx)
        recorded = callbacks.recorded()
        assert recorded is not None
        self.handles.append((recorded["process"]["pgid"], handle))
        return {"execution_id": ctx.execution_id, "recovery": recorded, "handle": handle}

    def context(self, name: str, launched: dict[str, Any], n: int) -> ExecutionContext:
        ctx, _ = make_context(
            self.tmp_path, {"command": "true"}, execution_id=launched["execution_id"], epoch=2,
            recovery=launched["recovery"],
            callbacks=FileCallbacks(self.tmp_path / f"{name}-recovered-{n}.json"),
        )  # fmt: skip
        return ctx

    async def stop_all(self) -> None:
        for pgid, handle in self.handles:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(OperationError), anyio.fail_after(20):
                await handle.wait()  # reaps the wrapper this process started


def _with_process(recovery: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**recovery, "process": {**recovery["process"], **changes}}


async def _outcome(executor: ShellExecutor, ctx: ExecutionContext) -> tuple[str, str | None]:
    try:
        await executor.recover(ctx)
    except OperationError as exc:
        return type(exc).__name__, exc.code
    return "adopted", None


def _never_proven(records: Sequence[JobRecord]) -> list[bool]:
    return [False] * len(records)


async def test_batched_recovery_adopts_and_refuses_as_the_single_path(
    tmp_path: Path, leaders: list[subprocess.Popen[bytes]]
) -> None:
    jobs = _Jobs(tmp_path)
    try:
        running = [await jobs.launch(f"running-{n}", "sleep 60") for n in range(3)]
        finished = await jobs.launch("finished", "exit 3")
        dead = await jobs.launch("dead", "sleep 60")
        assert (await finished["handle"].wait()).summary == "exit status 3"
        os.killpg(dead["recovery"]["process"]["pgid"], signal.SIGKILL)
        with pytest.raises(OperationError, match="without recording an exit status"):
            await dead["handle"].wait()  # reaps the wrapper, as a later daemon would never see
        # SIGKILL is sent, not yet suffered: a job process still exiting is one recovery must
        # call ambiguous. Both paths below judge the job once no live process of it is left.
        await wait_until_async(
            lambda: not tagged_processes(dead["execution_id"]), "the killed job's processes to end"
        )
        unrelated = leaders[0]
        # Another process now holds a pid a job's record names: its own create time differs.
        reused = {
            **running[0],
            "execution_id": "exec-reused",
            "recovery": {
                **_with_process(
                    running[0]["recovery"],
                    pid=unrelated.pid,
                    pgid=unrelated.pid,
                    create_time=_ctime(unrelated) - 1000,
                ),
                "workspace": str(tmp_path / "reused-workspace"),
                "marker": "exec-reused/2/0000",
            },
        }
        (tmp_path / "reused-workspace").mkdir()
        out_of_group = {
            **running[1],
            "recovery": _with_process(running[1]["recovery"], pgid=os.getpgid(0)),
        }
        cases = {
            "running": running[2],
            "finished": finished,
            "dead group": dead,
            "reused pid": reused,
            "out of its group": out_of_group,
        }

        batched = ShellExecutor()
        outcomes: dict[str, tuple[str, str | None]] = {}

        async def recover(name: str, ctx: ExecutionContext) -> None:
            outcomes[name] = await _outcome(batched, ctx)

        async with anyio.create_task_group() as tg:
            for name, launched in cases.items():
                tg.start_soon(recover, name, jobs.context(name, launched, 1))
        checks = batched._wrappers
        assert checks.checks == len(cases)
        assert checks.looks == 1, "one look for all of them"

        single = ShellExecutor()
        single._wrappers = WrapperChecks(_never_proven)
        alone = {
            name: await _outcome(single, jobs.context(name, launched, 2))
            for name, launched in cases.items()
        }

        assert outcomes == alone
        assert outcomes == {
            "running": ("adopted", None),
            "finished": ("adopted", None),
            "dead group": ("ResourcesGoneError", "resources_gone"),
            "reused pid": ("ResourcesGoneError", "resources_gone"),
            # Its processes still carry the job's marker: nobody can tell, the attempt is held.
            "out of its group": ("OperationError", "recovery_ambiguous"),
        }
        assert unrelated.poll() is None, "a reused pid's process is left alone"
    finally:
        await jobs.stop_all()


# --- the gathering -------------------------------------------------------------------------


class _RecordingLook:
    """A look that records each batch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __call__(self, records: Sequence[JobRecord]) -> list[bool]:
        self.batches.append([r.pid for r in records])
        return [r.pid % 2 == 0 for r in records]


def _pid_record(pid: int) -> JobRecord:
    return JobRecord(pid=pid, pgid=pid, create_time=1.0, workspace="/", launched_at=1.0)


async def test_checks_asked_together_share_one_look() -> None:
    look = _RecordingLook()
    checks = WrapperChecks(look)
    answers: dict[int, bool] = {}

    async def ask(pid: int) -> None:
        answers[pid] = await checks.alive(_pid_record(pid))

    async with anyio.create_task_group() as tg:
        for pid in range(1, 51):
            tg.start_soon(ask, pid)

    assert look.batches == [list(range(1, 51))]
    assert answers == {pid: pid % 2 == 0 for pid in range(1, 51)}


async def test_a_failing_look_proves_nothing_and_leaves_the_next_look_working() -> None:
    calls: list[int] = []

    def failing_once(records: Sequence[JobRecord]) -> list[bool]:
        calls.append(len(records))
        if len(calls) == 1:
            raise OSError("no /proc")
        return [True] * len(records)

    checks = WrapperChecks(failing_once)
    assert await checks.alive(_pid_record(2)) is False  # unproven: the caller's single path
    assert await checks.alive(_pid_record(2)) is True
    assert calls == [1, 1]
