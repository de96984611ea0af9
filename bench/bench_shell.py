"""Shell attempts per second for /bin/true through the executor, against raw subprocess.run.

    .venv/bin/python bench/bench_shell.py [--attempts N]

Each executor attempt is a full launch as the core drives it: decode the binding config, create
the workspace, start the detached wrapper, persist recovery metadata (to a JSON file, written and
renamed), then wait for the exit and build the result. The "wrapper floor" line is the same
``/bin/sh`` wrapper started with ``subprocess.run``: the cost of recording the exit status
durably, which any executor whose jobs outlive the daemon pays.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import anyio
from _harness import JsonFileCallbacks  # type: ignore[import-not-found]

from conduit_core.extension import ExecutionContext
from conduit_executors_shell import ShellExecutor, decode_config
from conduit_executors_shell._launch import wrapper_script


async def executor_rate(attempts: int, state_dir: Path, concurrency: int = 1) -> float:
    """Attempts per second with ``concurrency`` attempts in flight (as the jobs pool runs them)."""
    executor = ShellExecutor()
    slots = anyio.Semaphore(concurrency)

    async def one(number: int) -> None:
        async with slots:
            await attempt(number)

    async def attempt(number: int) -> None:
        callbacks = JsonFileCallbacks(state_dir / f"recovery-{number % concurrency}.json")
        ctx = ExecutionContext(
            execution_id=f"bench-{number}",
            work_id="bench",
            attempt=1,
            epoch=1,
            scope="root",
            binding="true",
            executor="shell",
            generation=2,
            config={"command": ["/bin/true"]},
            state_dir=str(state_dir),
            callbacks=callbacks,
        )
        result = await (await executor.run(ctx)).wait()
        assert result.summary == "exit status 0", result.summary

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for number in range(attempts):
            tg.start_soon(one, number)
    return attempts / (time.perf_counter() - started)


def raw_rate(attempts: int) -> float:
    started = time.perf_counter()
    for _ in range(attempts):
        subprocess.run(["/bin/true"], check=True)
    return attempts / (time.perf_counter() - started)


def wrapper_floor_rate(attempts: int, workdir: Path) -> float:
    script = wrapper_script(decode_config({"command": ["/bin/true"]}))
    (workdir / "input.jsonl").write_bytes(b"")
    argv = ["/bin/sh", "-c", script, "conduit-shell", str(workdir), "/bin/true"]
    started = time.perf_counter()
    for _ in range(attempts):
        subprocess.run(argv, check=True, start_new_session=True)
    return attempts / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=500)
    parser.add_argument(
        "--concurrency", type=int, default=4, help="attempts in flight (job_concurrency default: 4)"
    )
    args = parser.parse_args()
    attempts = args.attempts
    with tempfile.TemporaryDirectory(prefix="conduit-bench-shell-") as tmp:
        root = Path(tmp)
        (root / "floor").mkdir()
        raw = raw_rate(attempts)
        floor = wrapper_floor_rate(attempts, root / "floor")
        serial = anyio.run(executor_rate, attempts, root, 1)
        through_executor = anyio.run(executor_rate, attempts, root, args.concurrency)
    print(f"attempts per run:             {attempts}")
    print(f"raw subprocess.run /bin/true: {raw:8.1f} /s")
    print(f"wrapper floor (sh + status):  {floor:8.1f} /s  ({floor / raw:.2f} of raw)")
    print(f"shell executor, one at a time: {serial:8.1f} /s  ({serial / raw:.2f} of raw)")
    print(
        f"shell executor, {args.concurrency} in flight:  {through_executor:8.1f} /s  "
        f"({through_executor / raw:.2f} of raw)"
    )
    print(f"ratio executor ({args.concurrency} in flight) / raw: {through_executor / raw:.2f}")


if __name__ == "__main__":
    main()
