"""Container attempts per second for ``true`` through the executor, against ``docker run --rm``.

    .venv/bin/python bench/bench_container.py [--attempts N] [--rounds R] [--image IMAGE]

Each executor attempt is a full launch as the core drives it: plan (decode the config, look the
image up), create (clear leftovers of older epochs, create the labelled container), pin, persist
recovery metadata (to a JSON file, written and renamed), start; then wait for the exit, capture
the logs, read the result file and remove the container. The other figure is the docker CLI's
``docker run --rm IMAGE true`` in a subprocess. The two are measured alternately in ``--rounds``
slices so that engine and disk noise hits both alike. Needs the engine and the image that
``scripts/services.sh`` provides.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import anyio
from _harness import JsonFileCallbacks  # type: ignore[import-not-found]

from conduit_core.extension import ExecutionContext
from conduit_executors_container import ContainerExecutor

IMAGE = "conduit-test-busybox:latest"


async def executor_seconds(
    executor: ContainerExecutor, attempts: int, state_dir: Path, image: str
) -> float:
    callbacks = JsonFileCallbacks(state_dir / "recovery.json")
    started = time.perf_counter()
    for _ in range(attempts):
        ctx = ExecutionContext(
            execution_id=f"bench-{uuid.uuid4().hex[:12]}",
            work_id="bench",
            attempt=1,
            epoch=1,
            scope="root",
            binding="true",
            executor="container",
            generation=1,
            config={"image": image, "command": ["true"]},
            state_dir=str(state_dir),
            callbacks=callbacks,
        )
        result = await (await executor.run(ctx)).wait()
        assert result.summary == "exit status 0", result.summary
    return time.perf_counter() - started


def docker_run_seconds(attempts: int, image: str) -> float:
    started = time.perf_counter()
    for _ in range(attempts):
        subprocess.run(
            ["docker", "run", "--rm", "--network", "none", image, "true"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return time.perf_counter() - started


async def measure(attempts: int, rounds: int, image: str, state_dir: Path) -> tuple[float, float]:
    executor = ContainerExecutor()
    per_round = max(1, attempts // rounds)
    ours = theirs = 0.0
    # One warm-up each: the first create after an import pays the engine's layer setup.
    await executor_seconds(executor, 1, state_dir, image)
    docker_run_seconds(1, image)
    for _ in range(rounds):
        ours += await executor_seconds(executor, per_round, state_dir, image)
        theirs += await anyio.to_thread.run_sync(docker_run_seconds, per_round, image)
    executor.engine.close()
    done = per_round * rounds
    return done / ours, done / theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--image", default=IMAGE)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conduit-bench-container-") as tmp:
        ours, theirs = anyio.run(measure, args.attempts, args.rounds, args.image, Path(tmp))
    print(f"image:                          {args.image}")
    print(f"attempts per run:               {args.attempts} ({args.rounds} alternating rounds)")
    print(f"docker run --rm IMAGE true:     {theirs:8.2f} /s")
    print(f"container executor attempts:    {ours:8.2f} /s")
    print(f"ratio executor / docker run:    {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
