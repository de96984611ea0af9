"""Shell attempts per second for /bin/true through the executor, against raw subprocess.run.

    .venv/bin/python bench/bench_shell.py [--attempts N]
    .venv/bin/python bench/bench_shell.py --stops 30 60 --baseline OLD_SRC [--idle 500]

Each executor attempt is a full launch as the core drives it: decode the binding config, create
the workspace, start the detached wrapper, persist recovery metadata (to a JSON file, written and
renamed), then wait for the exit and build the result. The "wrapper floor" line is the same
``/bin/sh`` wrapper started with ``subprocess.run``: the cost of recording the exit status
durably, which any executor whose jobs outlive the daemon pays.

``--stops N…``: a successor's many stops at once, this checkout's shell executor against the one
whose ``src`` folder ``--baseline`` names, alternated in one run, each in a fresh interpreter.
``ended``: N jobs ended while another executor (a paused daemon) did not reap their wrappers; a
fresh executor adopts them all at once and waits for their results (each wait stops the job's
group, where the zombie wrapper is left, so each scans the process table). ``running``: N running
``sleep`` jobs stopped at once (a scan, SIGTERM, the verification polls). ``--idle`` processes are
started after the jobs, so every scan must read their environment, as for the processes a loaded
machine starts meanwhile. Prints the median seconds until all N are done, and the census' looks
and scans.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _harness import JsonFileCallbacks  # type: ignore[import-not-found]

from conduit_core.extension import ExecutionContext, StopTarget
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


def _context(state_dir: Path, number: int, command: str, **more: Any) -> ExecutionContext:
    return ExecutionContext(
        execution_id=f"stops-{number}", work_id="bench", attempt=1, scope="root", binding="job",
        executor="shell", generation=3, config={"command": command, "stop_grace_seconds": 5},
        state_dir=str(state_dir),
        callbacks=JsonFileCallbacks(state_dir / f"recovery-{number}.json"), **more,
    )  # fmt: skip


def stops_once(jobs: int, scenario: str, idle: int, state_dir: Path) -> dict[str, Any]:
    """One measurement in this interpreter: N jobs launched by one executor, then stopped (or
    adopted and waited for) all at once by a fresh one, beside ``idle`` newer idle processes."""
    paused = ShellExecutor()  # never reaps: its wrappers stay zombies, as a paused daemon's do
    command = "true" if scenario == "ended" else "sleep 60 & sleep 60"
    launched = anyio.run(_launch_all, paused, jobs, command, state_dir)
    while scenario == "ended" and not all(
        any(Path(r["workspace"]).glob("exit-status.*")) for r in launched
    ):
        time.sleep(0.01)
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(idle)]
    try:
        return anyio.run(_successor, scenario, launched, command, state_dir)
    finally:
        for sleeper in sleepers:
            sleeper.kill()
        for sleeper in sleepers:
            sleeper.wait()


async def _launch_all(
    executor: ShellExecutor, jobs: int, command: str, state_dir: Path
) -> list[dict[str, Any]]:
    launched = []
    for number in range(jobs):
        await executor.run(_context(state_dir, number, command, epoch=1))
        recorded = await anyio.Path(state_dir / f"recovery-{number}.json").read_text()
        launched.append(json.loads(recorded))
    return launched


async def _successor(
    scenario: str, launched: list[dict[str, Any]], command: str, state_dir: Path
) -> dict[str, Any]:
    """Seconds until a fresh executor has adopted and awaited (``ended``) or stopped
    (``running``) every job, all at once."""
    successor = ShellExecutor()

    async def adopt(number: int) -> None:
        ctx = _context(state_dir, number, command, epoch=2, recovery=launched[number])
        result = await (await successor.recover(ctx)).wait()
        assert result.summary == "exit status 0", result.summary

    async def stop(number: int) -> None:
        target = StopTarget(
            execution_id=f"stops-{number}", epoch=1, work_id="bench",
            config={"command": command, "stop_grace_seconds": 5}, recovery=launched[number],
        )  # fmt: skip
        evidence = await successor.stop(target)
        assert evidence.verified, evidence.detail

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for number in range(len(launched)):
            tg.start_soon(adopt if scenario == "ended" else stop, number)
    seconds = time.perf_counter() - started
    census = getattr(successor, "_census", None)  # None: the baseline has none
    return {
        "seconds": seconds,
        "looks": getattr(census, "looks", None),
        "scans": getattr(census, "scans", None),
    }


def stops(args: argparse.Namespace) -> None:
    """Alternate this checkout and the baseline, each measurement in a fresh interpreter."""
    here = Path(__file__).resolve().parent.parent
    sides = {"baseline": args.baseline, "this": str(here / "conduit_executors_shell" / "src")}
    core = str(here / "conduit_core" / "src")
    runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    # Cores kept busy, as on the loaded machine where CI found jobs run twice.
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        for _ in range(args.rounds):
            for scenario in args.scenarios:
                for jobs in args.stops:
                    for side, src in sides.items():
                        env = os.environ | {"PYTHONPATH": f"{src}:{core}"}
                        argv = [sys.executable, __file__, "--stops-child", str(jobs),
                                "--scenario", scenario, "--idle", str(args.idle)]  # fmt: skip
                        out = subprocess.run(
                            argv, env=env, check=True, capture_output=True, text=True
                        )
                        run = json.loads(out.stdout.splitlines()[-1])
                        runs.setdefault((scenario, jobs, side), []).append(run)
                        print(f"{scenario} jobs={jobs} {side}: {json.dumps(run)}", flush=True)
    finally:
        for spinner in busy:
            spinner.kill()
            spinner.wait()
    for scenario in args.scenarios:
        for jobs in args.stops:
            medians = {
                side: statistics.median(r["seconds"] for r in runs[(scenario, jobs, side)])
                for side in sides
            }
            counted = runs[(scenario, jobs, "this")][-1]
            print(
                f"{scenario:8} jobs={jobs:3} idle={args.idle} busy={args.busy}: baseline "
                f"{medians['baseline']:.3f} s, this {medians['this']:.3f} s "
                f"({medians['baseline'] / medians['this']:.1f}x; this: {counted['looks']} looks "
                f"for {counted['scans']} scans)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=500)
    parser.add_argument(
        "--concurrency", type=int, default=4, help="attempts in flight (job_concurrency default: 4)"
    )
    parser.add_argument("--stops", type=int, nargs="+", help="N jobs stopped at once (a mode)")
    parser.add_argument("--baseline", help="the shell executor's src folder to compare with")
    parser.add_argument("--scenarios", nargs="+", default=["ended", "running"])
    parser.add_argument("--idle", type=int, default=500, help="idle processes beside the jobs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="CPU spinners during the run")
    parser.add_argument("--stops-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--scenario", default="ended", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stops_child:
        with tempfile.TemporaryDirectory(prefix="conduit-bench-stops-") as tmp:
            run = stops_once(args.stops_child, args.scenario, args.idle, Path(tmp))
        print(json.dumps(run))
        return
    if args.stops:
        if not args.baseline:
            parser.error("--stops needs --baseline (the src folder of the code to compare with)")
        stops(args)
        return
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
