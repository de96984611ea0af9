"""Controls on a running job: inject, interrupt and stop, with stops verified by psutil."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conduit_core.extension import InputEvent, NotAcceptingError, OutcomeKind, StopTarget
from conduit_executors_shell import ShellExecutor
from tests.shell._harness import (
    is_running,
    make_context,
    pid_from_file,
    read_lines,
    tagged_processes,
    wait_until_async,
)

pytestmark = pytest.mark.anyio


async def test_inject_appends_to_the_running_jobs_input_stream(tmp_path: Path) -> None:
    seen = tmp_path / "seen.jsonl"
    # The job reads exactly two input lines: the launch batch's one and an injected one.
    config = {"command": f"head -n 2 > {seen}", "accept_input": True}
    ctx, _ = make_context(tmp_path, config, inputs=[InputEvent(id="first", type="t")])
    executor = ShellExecutor()
    handle = await executor.run(ctx)

    await executor.inject(ctx.stop_target(), [InputEvent(id="second", type="t", payload=[1])])
    result = await handle.wait()

    assert result.outcome is OutcomeKind.COMPLETED
    assert [json.loads(line)["id"] for line in read_lines(seen)] == ["first", "second"]
    assert tagged_processes(ctx.execution_id) == [], "the input feeder ends with the job"
    with pytest.raises(NotAcceptingError):
        await executor.inject(ctx.stop_target(), [InputEvent(id="late", type="t")])


async def test_inject_is_refused_when_the_binding_does_not_accept_input(tmp_path: Path) -> None:
    ctx, _ = make_context(tmp_path, {"command": "sleep 60"})
    executor = ShellExecutor()
    handle = await executor.run(ctx)
    await wait_until_async(lambda: len(tagged_processes(ctx.execution_id)) >= 2, "the job")
    try:
        with pytest.raises(NotAcceptingError) as caught:
            await executor.inject(ctx.stop_target(), [InputEvent(id="x", type="t")])
        assert caught.value.code == "not_accepting"
    finally:
        assert (await executor.stop(ctx.stop_target())).verified
    await handle.wait()


async def test_interrupt_stops_the_group_and_the_job_ends_with_its_signal(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    config = {"command": f"sleep 60 & echo $! > {child}; wait", "stop_grace_seconds": 5}
    ctx, _ = make_context(tmp_path, config)
    executor = ShellExecutor()
    handle = await executor.run(ctx)
    await wait_until_async(child.exists, "the job's child to start")

    evidence = await executor.interrupt(ctx.stop_target())

    assert evidence.verified
    assert "SIGTERM" in evidence.detail
    assert "0 needed SIGKILL" in evidence.detail
    assert not is_running(pid_from_file(child))
    result = await handle.wait()
    # The wrapper outlives the stop signal long enough to record the job's status.
    assert result.summary == f"exit status {128 + 15}"


async def test_stop_with_a_custom_signal_escalates_and_verifies(tmp_path: Path) -> None:
    config = {
        "command": "trap '' INT; sleep 60",
        "stop_signal": "INT",
        "stop_grace_seconds": 0.2,
    }
    ctx, _ = make_context(tmp_path, config)
    executor = ShellExecutor()
    handle = await executor.run(ctx)
    await wait_until_async(lambda: len(tagged_processes(ctx.execution_id)) >= 2, "the job")

    evidence = await executor.stop(ctx.stop_target())

    assert evidence.verified
    assert "SIGINT" in evidence.detail
    assert "0 needed SIGKILL" not in evidence.detail
    assert tagged_processes(ctx.execution_id) == []
    assert (await handle.wait()).summary == f"exit status {128 + 9}"


async def test_a_process_the_job_starts_after_the_stop_signal_gets_it_too(tmp_path: Path) -> None:
    # As a stop that lands while the wrapper is still starting the job: a process of the job
    # appears after the signal went out. Here the job's shell, on SIGTERM, starts a new process
    # and waits for it; unsignalled, it would run until SIGKILL, the whole grace later.
    ready = tmp_path / "trapping"
    config = {
        "command": f"trap 'trap - TERM; sleep 60 & wait; exit 3' TERM; : > {ready}; "
        "while :; do sleep 0.05; done",
        "stop_grace_seconds": 30,
    }
    ctx, _ = make_context(tmp_path, config)
    executor = ShellExecutor()
    handle = await executor.run(ctx)
    await wait_until_async(ready.exists, "the job to set its trap")

    evidence = await executor.stop(ctx.stop_target())

    assert evidence.verified
    assert "appeared after the first signal" in evidence.detail
    assert "0 needed SIGKILL" in evidence.detail, evidence.detail
    assert tagged_processes(ctx.execution_id) == []
    assert (await handle.wait()).summary == "exit status 3"


async def test_stop_without_metadata_finds_the_job_by_its_execution_tag(tmp_path: Path) -> None:
    ctx, _ = make_context(tmp_path, {"command": "sleep 60"})
    executor = ShellExecutor()
    handle = await executor.run(ctx)
    await wait_until_async(lambda: len(tagged_processes(ctx.execution_id)) >= 2, "the job")
    # As if the daemon crashed between starting the job and recording its metadata.
    target = StopTarget(execution_id=ctx.execution_id, epoch=2, work_id=ctx.work_id, config={})

    evidence = await executor.stop(target)

    assert evidence.verified
    assert tagged_processes(ctx.execution_id) == []
    await handle.wait()


async def test_stop_of_a_finished_job_is_verified_at_once(tmp_path: Path) -> None:
    ctx, _ = make_context(tmp_path, {"command": "true"})
    executor = ShellExecutor()
    await (await executor.run(ctx)).wait()
    evidence = await executor.stop(ctx.stop_target())
    assert evidence.verified
    assert evidence.detail.startswith("no process")
