"""Launching python jobs in real interpreters: typed results, bad input, exceptions, retry hints."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from conduit_core.extension import InputEvent, OperationError, OutcomeKind, Result
from conduit_executors_python.executor import PythonExecutor
from tests.pyexec._config import binding
from tests.shell._harness import artifact_text, make_context, tagged_processes

pytestmark = pytest.mark.anyio


async def _run(
    tmp_path: Path, config: dict[str, Any], payload: Any = None, **context: Any
) -> tuple[Result, dict[str, Any] | None]:
    await anyio.Path(tmp_path).mkdir(parents=True, exist_ok=True)
    inputs = [InputEvent(id="ev-1", type="submitted", payload=payload)]
    ctx, callbacks = make_context(tmp_path, config, generation=1, inputs=inputs, **context)
    result = await (await PythonExecutor().run(ctx)).wait()
    assert tagged_processes(ctx.execution_id) == []
    return result, callbacks.recorded()


async def test_typed_return_from_struct_parameters(tmp_path: Path) -> None:
    payload = {"size": {"width": 3, "height": 4}}
    result, recorded = await _run(tmp_path, binding("area"), payload)
    assert result.outcome is OutcomeKind.COMPLETED, result.summary
    assert result.data["return"] == {"size": {"width": 3, "height": 4}, "area": 12, "label": "box"}
    assert result.data["exit_status"] == 0
    # The durable machinery is the shell job's: its recovery layout, intent and wrapper.
    assert recorded is not None
    assert recorded["layout"] == "shell/3"


async def test_async_function_runs_to_its_value(tmp_path: Path) -> None:
    result, _ = await _run(tmp_path, binding("doubled"), {"n": 21})
    assert result.outcome is OutcomeKind.COMPLETED, result.summary
    assert result.data["return"] == [21, 42]


async def test_no_payload_calls_without_arguments_and_captures_stdout(tmp_path: Path) -> None:
    result, _ = await _run(tmp_path, binding("nothing"))
    assert result.outcome is OutcomeKind.COMPLETED, result.summary
    assert result.data["return"] is None
    assert artifact_text(result, "stdout") == "ran\n"


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ({"size": {"width": "3", "height": 4}}, "parameter 'size': Expected `int`, got `str` - at `$.width`"),
        ({}, "parameter 'size': missing from the input"),
        ({"size": {"width": 1, "height": 1}, "colour": "red"}, "parameter 'colour': area has no such parameter"),
        ([1, 2], "the input payload must be a JSON object of area's parameters"),
    ],
)
async def test_bad_input_is_permanent_invalid_input_naming_the_parameter(
    tmp_path: Path, payload: Any, named: str
) -> None:
    result, _ = await _run(tmp_path, binding("area"), payload)
    assert result.outcome is OutcomeKind.FAILED
    assert result.permanent
    assert result.data["code"] == "invalid_input"
    assert result.summary.startswith(f"invalid_input: {named}"), result.summary


async def test_exception_fails_with_type_and_message_and_traceback_in_stderr(
    tmp_path: Path,
) -> None:
    result, _ = await _run(tmp_path, binding("fails"), {"message": "no stock"})
    assert result.outcome is OutcomeKind.FAILED
    assert not result.permanent
    assert result.retry_hint is None
    assert result.summary == "ValueError: no stock"
    assert result.data["exception"] == {"type": "ValueError", "message": "no stock"}
    stderr = artifact_text(result, "stderr")
    assert "Traceback (most recent call last)" in stderr
    assert 'raise ValueError(message)' in stderr


async def test_a_huge_exception_message_is_clipped_in_the_result(tmp_path: Path) -> None:
    result, _ = await _run(tmp_path, binding("fails"), {"message": "x" * 2_000_000})
    assert result.outcome is OutcomeKind.FAILED
    assert result.data["exception"]["message"].endswith("… (2000000 characters, see stderr)")
    assert len(result.summary) < 5000


async def test_permanent_and_retry_map_to_the_result(tmp_path: Path) -> None:
    gave_up, _ = await _run(tmp_path / "a", binding("gives_up"))
    assert gave_up.outcome is OutcomeKind.FAILED
    assert gave_up.permanent
    assert gave_up.summary == "conduit_executors_python._signals.Permanent: the order is gone"

    before_ms = time.time() * 1000
    later, _ = await _run(tmp_path / "b", binding("later"), {"after": 30})
    assert later.outcome is OutcomeKind.FAILED
    assert not later.permanent
    assert later.retry_hint is not None
    assert later.retry_hint.reset_at_ms is not None
    assert before_ms + 30_000 <= later.retry_hint.reset_at_ms <= time.time() * 1000 + 30_000


async def test_run_environment_and_binding_env_reach_os_environ(tmp_path: Path) -> None:
    config = binding("environment", env={"FROM_BINDING": "b"})
    result, recorded = await _run(
        tmp_path / "a", config, {"name": "FROM_RUN"}, env={"FROM_RUN": "secret"}
    )
    assert result.data["return"] == "secret"
    assert "secret" not in json.dumps(recorded)  # the run environment is never persisted
    result, _ = await _run(tmp_path / "b", config, {"name": "FROM_BINDING"})
    assert result.data["return"] == "b"


async def test_a_return_value_off_its_annotation_is_invalid_result(tmp_path: Path) -> None:
    result, _ = await _run(tmp_path, binding("wrong_return"))
    assert result.outcome is OutcomeKind.FAILED
    assert result.data["code"] == "invalid_result"
    assert "the return value: Expected `int`, got `str`" in result.summary


async def test_a_function_that_cannot_be_imported_is_permanent_invalid_config(
    tmp_path: Path,
) -> None:
    result, _ = await _run(tmp_path, binding("missing"))
    assert result.permanent
    assert result.data["code"] == "invalid_config"
    assert "$.function: cannot import 'tests.pyexec.funcs:missing'" in result.summary


async def test_the_binding_interpreter_runs_the_function(tmp_path: Path) -> None:
    result, _ = await _run(tmp_path, binding("nothing", python=sys.executable))
    assert result.outcome is OutcomeKind.COMPLETED, result.summary


@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({}, "$.function"),
        ({"function": "no colon"}, "$.function"),
        ({"function": "m:f", "colour": 1}, "$.colour"),
        ({"function": "m:f", "stop_signal": "SIGNOPE"}, "$.stop_signal"),
        ({"function": "m:f", "python": "/nonexistent/python3"}, "$.python"),
    ],
)
async def test_bad_config_is_permanent_invalid_config_naming_the_field(
    tmp_path: Path, config: dict[str, Any], path: str
) -> None:
    ctx, callbacks = make_context(tmp_path, config, generation=1)
    with pytest.raises(OperationError) as caught:
        await PythonExecutor().run(ctx)
    assert caught.value.code == "invalid_config"
    assert caught.value.permanent
    assert f"at `{path}`" in caught.value.message
    assert callbacks.launch_intent is None  # nothing was recorded or started


async def test_timeout_stops_the_function_and_fails_the_attempt(tmp_path: Path) -> None:
    release = tmp_path / "never"
    config = binding("once", timeout_seconds=0.5, stop_grace_seconds=0.5)
    payload = {"side": str(tmp_path / "side"), "release": str(release)}
    result, _ = await _run(tmp_path, config, payload)
    assert result.outcome is OutcomeKind.FAILED
    assert result.data["code"] == "timeout"
    assert (tmp_path / "side").read_text().split() == ["work-1", "start"]  # stopped mid-function


async def test_a_retry_attempt_decodes_the_input_it_retries_not_the_retry_event(
    tmp_path: Path,
) -> None:
    # A retry attempt's batch is the retried input, then the core's retry event (its payload is
    # the retry's bookkeeping): the function gets the retried input, in both modes.
    inputs = [
        InputEvent(id="ev-1", type="submitted", payload={"n": 4}),
        InputEvent(id="ev-2", type="core.retry", payload={"attempt": 2, "trigger": ["ev-1"]}),
    ]
    ctx, _ = make_context(tmp_path, binding("doubled"), generation=1, inputs=inputs)
    result = await (await PythonExecutor().run(ctx)).wait()
    assert result.outcome is OutcomeKind.COMPLETED, result.summary
    assert result.data["return"] == [4, 8]
