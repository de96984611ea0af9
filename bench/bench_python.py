"""Per-attempt cost of the python executor's cold mode, against the shell executor and raw starts.

    .venv/bin/python bench/bench_python.py [--attempts N]

Each executor attempt is a full launch as the core drives it (config, workspace, detached
wrapper, recovery metadata to a JSON file, wait, result), one at a time. The python attempt runs
``os:getpid`` through ``python -m conduit_executors_python._runner`` (a fresh interpreter that
imports msgspec and the runner, decodes the input and writes the typed result). The raw lines are
the same interpreter started with ``subprocess.run``: ``-c pass`` (the interpreter's own start) and
the runner itself (no wrapper, no executor).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _harness import JsonFileCallbacks  # type: ignore[import-not-found]

from conduit_core.extension import ExecutionContext, Executor, OutcomeKind
from conduit_executors_python.executor import PythonExecutor
from conduit_executors_shell import ShellExecutor


async def executor_ms(
    executor: Executor, name: str, config: dict[str, Any], attempts: int, state_dir: Path
) -> float:
    """Milliseconds per attempt, one attempt at a time."""
    started = time.perf_counter()
    for number in range(attempts):
        ctx = ExecutionContext(
            execution_id=f"bench-{name}-{number}",
            work_id="bench",
            attempt=1,
            epoch=1,
            scope="root",
            binding=name,
            executor=name,
            generation=1,
            config=config,
            state_dir=str(state_dir),
            callbacks=JsonFileCallbacks(state_dir / f"recovery-{name}.json"),
        )
        result = await (await executor.run(ctx)).wait()
        assert result.outcome is OutcomeKind.COMPLETED, result.summary
    return (time.perf_counter() - started) * 1000 / attempts


def raw_ms(argv: list[str], attempts: int, env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    for _ in range(attempts):
        subprocess.run(argv, check=True, env=env, stdin=subprocess.DEVNULL)
    return (time.perf_counter() - started) * 1000 / attempts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=100)
    attempts = parser.parse_args().attempts
    with tempfile.TemporaryDirectory(prefix="conduit-bench-python-") as tmp:
        root = Path(tmp)
        result_env = {**os.environ, "CONDUIT_RESULT": str(root / "result.json")}
        interpreter = raw_ms([sys.executable, "-c", "pass"], attempts)
        runner = raw_ms(
            [sys.executable, "-m", "conduit_executors_python._runner", "os:getpid"],
            attempts, env=result_env,
        )  # fmt: skip
        shell = anyio.run(
            executor_ms, ShellExecutor(3), "shell", {"command": ["/bin/true"]}, attempts, root
        )
        python = anyio.run(
            executor_ms, PythonExecutor(), "python", {"function": "os:getpid"}, attempts, root
        )
    print(f"attempts per line (serial):        {attempts}")
    print(f"raw python -c pass:                {interpreter:7.1f} ms")
    print(f"raw runner (os:getpid):            {runner:7.1f} ms")
    print(f"shell executor, /bin/true:         {shell:7.1f} ms")
    print(f"python executor (cold), os:getpid: {python:7.1f} ms")
    print(f"python executor over raw runner:   {python - runner:7.1f} ms")


if __name__ == "__main__":
    main()
