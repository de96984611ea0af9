"""Warm mode in real worker processes: the same decoding, results and signals as cold mode, one
interpreter kept between attempts, and stops and timeouts that end the function."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import conduit_core.plugins  # noqa: F401  (loads the daemon's program supervisor, as a daemon does)
from conduit_core.extension import (
    InputEvent,
    LostSightError,
    OutcomeKind,
    ResourcesGoneError,
    Result,
    StopTarget,
)
from conduit_executors_python.executor import PythonExecutor
from tests.daemon.conftest import wait_for
from tests.pyexec._config import binding
from tests.shell._harness import make_context

pytestmark = pytest.mark.anyio


@pytest.fixture
async def executor() -> AsyncIterator[PythonExecutor]:
    made = PythonExecutor()
    yield made
    await made._warm.close()


def warm(function: str, **more: Any) -> dict[str, Any]:
    return binding(function, mode="warm", **more)


async def _run(
    executor: PythonExecutor, tmp_path: Path, config: dict[str, Any], payload: Any = None
) -> Result:
    inputs = [InputEvent(id="ev-1", type="submitted", payload=payload)]
    ctx, _ = make_context(tmp_path, config, generation=1, inputs=inputs)
    return await (await executor.run(ctx)).wait()


async def test_one_warm_worker_runs_attempts_with_cold_modes_results(
    executor: PythonExecutor, tmp_path: Path
) -> None:
    first = await _run(executor, tmp_path, warm("pid"))
    second = await _run(executor, tmp_path, warm("pid"))
    worker = first.data["return"]
    assert second.data["return"] == worker != os.getpid()  # one interpreter, kept between them

    area = await _run(executor, tmp_path, warm("area"), {"size": {"width": 3, "height": 4}})
    assert area.data["return"] == {"size": {"width": 3, "height": 4}, "area": 12, "label": "box"}
    doubled = await _run(executor, tmp_path, warm("doubled"), {"n": 21})
    assert doubled.data["return"] == [21, 42]

    bad = await _run(executor, tmp_path, warm("area"), {"size": {"width": "3", "height": 4}})
    assert bad.permanent
    assert bad.data["code"] == "invalid_input"
    assert bad.summary == (
        "invalid_input: parameter 'size': Expected `int`, got `str` - at `$.width`"
    )
    failed = await _run(executor, tmp_path, warm("fails"), {"message": "no stock"})
    assert (failed.outcome, failed.permanent, failed.summary) == (
        OutcomeKind.FAILED, False, "ValueError: no stock"
    )  # fmt: skip
    assert failed.data["exception"] == {"type": "ValueError", "message": "no stock"}
    gave_up = await _run(executor, tmp_path, warm("gives_up"))
    assert gave_up.permanent
    assert gave_up.summary == "conduit_executors_python._signals.Permanent: the order is gone"
    later = await _run(executor, tmp_path, warm("later"), {"after": 30})
    assert later.retry_hint is not None
    assert later.retry_hint.reset_at_ms is not None
    wrong = await _run(executor, tmp_path, warm("wrong_return"))
    assert wrong.data["code"] == "invalid_result"
    missing = await _run(executor, tmp_path, warm("missing"))
    assert missing.permanent
    assert missing.data["code"] == "invalid_config"
    last = await _run(executor, tmp_path, warm("pid"))
    assert last.data["return"] == worker  # failures, refusals and exceptions kept it


async def test_binding_env_and_cwd_choose_the_worker(
    executor: PythonExecutor, tmp_path: Path
) -> None:
    a = await _run(executor, tmp_path, warm("environment", env={"WHERE": "a"}), {"name": "WHERE"})
    b = await _run(executor, tmp_path, warm("environment", env={"WHERE": "b"}), {"name": "WHERE"})
    assert (a.data["return"], b.data["return"]) == ("a", "b")


def _started(side: Path) -> int:
    wait_for("the function to start", lambda: side.exists() and "start" in side.read_text())
    return int(side.read_text().split()[1])


def _target(ctx: Any) -> StopTarget:
    return StopTarget(
        execution_id=ctx.execution_id, epoch=ctx.epoch, work_id=ctx.work_id, config=ctx.config
    )


async def test_stop_cancels_an_async_function_and_the_worker_lives_on(
    executor: PythonExecutor, tmp_path: Path
) -> None:
    side = tmp_path / "side"
    inputs = [InputEvent(id="e", type="submitted", payload={"side": str(side), "seconds": 300})]
    ctx, _ = make_context(tmp_path, warm("naps"), generation=1, inputs=inputs)
    handle = await executor.run(ctx)
    worker = _started(side)
    evidence = await executor.stop(_target(ctx))
    assert evidence.verified, evidence.detail
    result = await handle.wait()
    assert result.data["code"] == "stopped"
    assert "end" not in side.read_text()
    assert (await _run(executor, tmp_path, warm("pid"))).data["return"] == worker


async def test_a_sync_function_stuck_in_c_ends_with_its_worker_on_stop(
    executor: PythonExecutor, tmp_path: Path
) -> None:
    side = tmp_path / "side"
    config = warm("blocks", stop_grace_seconds=0.3)
    inputs = [InputEvent(id="e", type="submitted", payload={"side": str(side), "seconds": 300})]
    ctx, _ = make_context(tmp_path, config, generation=1, inputs=inputs)
    await executor.run(ctx)
    worker = _started(side)
    evidence = await executor.stop(_target(ctx))
    # time.sleep(300) never returns to Python: the worker exited, so the stop is true.
    assert evidence.verified, evidence.detail
    assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == "zombie"
    again = await _run(executor, tmp_path, warm("pid"))
    assert again.data["return"] != worker  # the supervisor started a new one


async def test_timeout_ends_a_sync_function_between_bytecodes(
    executor: PythonExecutor, tmp_path: Path
) -> None:
    release = tmp_path / "never"
    payload = {"side": str(tmp_path / "side"), "release": str(release), "tag": "t"}
    config = warm("warm_once", timeout_seconds=0.5, stop_grace_seconds=5)
    result = await _run(executor, tmp_path, config, payload)
    assert result.data["code"] == "timeout"
    worker = int((tmp_path / "side").read_text().split()[2])
    assert (tmp_path / "side").read_text().split()[:2] == ["t", "start"]
    assert (await _run(executor, tmp_path, warm("pid"))).data["return"] == worker


async def test_a_killed_worker_loses_its_attempt_to_resources_gone(
    executor: PythonExecutor, tmp_path: Path
) -> None:
    side = tmp_path / "side"
    payload = {"side": str(side), "release": str(tmp_path / "never"), "tag": "t"}
    inputs = [InputEvent(id="e", type="submitted", payload=payload)]
    ctx, _ = make_context(tmp_path, warm("warm_once"), generation=1, inputs=inputs)
    handle = await executor.run(ctx)
    wait_for("the function to start", lambda: side.exists())
    os.kill(int(side.read_text().split()[2]), signal.SIGKILL)
    with pytest.raises(LostSightError):
        await handle.wait()
    with pytest.raises(ResourcesGoneError):
        await executor.recover(ctx)


async def test_a_recover_while_its_worker_lives_adopts_the_running_call(
    executor: PythonExecutor, tmp_path: Path
) -> None:
    # A lease that moved while this daemon lives: the call still runs in its worker, so the
    # recovery at the next epoch adopts it (acknowledged by its metadata), never reruns it.
    side, release = tmp_path / "side", tmp_path / "release"
    payload = {"side": str(side), "release": str(release), "tag": "t"}
    inputs = [InputEvent(id="e", type="submitted", payload=payload)]
    ctx, _ = make_context(tmp_path, warm("warm_once"), generation=1, inputs=inputs)
    await executor.run(ctx)
    wait_for("the function to start", lambda: side.exists())
    (tmp_path / "2").mkdir()
    again, callbacks = make_context(
        tmp_path / "2", warm("warm_once"), generation=1, inputs=inputs,
        execution_id=ctx.execution_id, epoch=2,
    )  # fmt: skip
    adopted = await executor.recover(again)
    recorded = callbacks.recorded()
    assert recorded is not None
    assert recorded["worker"]["pid"] == int(side.read_text().split()[2])
    release.touch()
    result = await adopted.wait()
    assert result.data["return"] == recorded["worker"]["pid"]
    assert side.read_text().split().count("start") == 1
