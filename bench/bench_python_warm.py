"""The python executor's warm mode: per-attempt cost against cold mode, and throughput against the
in-process ``echo`` executor through the real Scheduler and store.

    .venv/bin/python bench/bench_python_warm.py [--attempts 50] [--store sqlite] [--n 1000]
        [--concurrency 64] [--rounds 3]

Per-attempt cost: one attempt at a time, the executor driven as the core drives it (as
``bench_python.py``), ``os:getpid`` in cold mode (a fresh interpreter per attempt) and in warm mode
(the worker started once, before the timing; each attempt is ``run`` → ``persist_recovery`` →
``callback_ok`` → ``launched`` with the result inline, the call in a thread of the worker).

Throughput: no-op attempts the whole way through the Scheduler (claim, fenced launch with its
recovery record, observe, fenced settle) on a real store, ``echo`` (in process, the line
``bench_wire.py`` compares against) and a warm python binding running ``os:getpid``, alternating
over ``--rounds`` so that the load of a shared machine falls on both alike. Target: warm at least
half of in-process at concurrency 64.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from bench_python import executor_ms  # type: ignore[import-not-found]
from bench_scheduler import (  # type: ignore[import-not-found]
    enqueue,
    fresh_url,
    gates_as_a_user_has_them,
    process,
)

from conduit_core.config import Binding
from conduit_core.plugins import Plugins
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
from conduit_core.storage import open_store
from conduit_executors_python.executor import PythonExecutor

WARM = {"function": "os:getpid", "mode": "warm"}


async def per_attempt(attempts: int, root: Path) -> tuple[float, float]:
    """Milliseconds per attempt: (cold, warm), serial."""
    cold = await executor_ms(PythonExecutor(), "cold", {"function": "os:getpid"}, 10, root)
    cold = await executor_ms(PythonExecutor(), "cold", {"function": "os:getpid"}, attempts, root)
    executor = PythonExecutor()
    try:
        await executor_ms(executor, "warmup", WARM, 3, root)  # the worker's start, untimed
        warm = await executor_ms(executor, "warm", WARM, attempts * 10, root)
    finally:
        await executor._warm.close()
    return cold, warm


async def rate(kind: str, binding: Binding, plugins: Plugins, n: int, concurrency: int) -> float:
    url, tmp = fresh_url(kind)
    try:
        async with await open_store(url) as store:
            sched = Scheduler(
                store, SystemClock(), plugins,
                SchedulerOptions(owner="bench", concurrency=max(concurrency, 1),
                                 job_concurrency=max(concurrency, 1),
                                 bindings={"noop": binding}),
            )  # fmt: skip
            await enqueue(store, n, SystemClock().now_ms())
            t0 = time.perf_counter()
            async with sched.keeping_leases():
                await process(sched, n, concurrency)
            elapsed = time.perf_counter() - t0
            assert not await store.ready_work(limit=1), "every Work must be completed"
    finally:
        tmp.cleanup()  # type: ignore[attr-defined]
    return n / elapsed


async def throughput(args: argparse.Namespace) -> dict[str, Any]:
    gates_as_a_user_has_them()
    plugins = Plugins.load(disabled=())
    bindings = {
        "echo": Binding(executor="echo"),
        "python-warm": Binding(executor="python", config=WARM),
    }
    rates: dict[str, list[float]] = {name: [] for name in bindings}
    # The worker's first start (imports) is not an attempt's cost: warm it before the timing.
    await rate(args.store, bindings["python-warm"], plugins, 20, 4)
    for _ in range(args.rounds):
        for name, binding in bindings.items():
            rates[name].append(await rate(args.store, binding, plugins, args.n, args.concurrency))
    in_process = statistics.median(rates["echo"])
    warm = statistics.median(rates["python-warm"])
    return {
        "store": args.store, "n": args.n, "concurrency": args.concurrency, "rounds": args.rounds,
        "in_process_per_s": round(in_process, 1), "warm_per_s": round(warm, 1),
        "ratio": round(warm / in_process, 3),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=50)
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conduit-bench-warm-") as tmp:
        cold, warm = anyio.run(per_attempt, args.attempts, Path(tmp))
    print(f"per attempt, serial: cold {cold:7.2f} ms, warm {warm:7.2f} ms ({cold / warm:.0f}x)")
    out = anyio.run(throughput, args)
    print(json.dumps({"cold_ms": round(cold, 2), "warm_ms": round(warm, 2), **out}))
    print(
        f"ratio warm / in-process at concurrency {args.concurrency}: {out['ratio']} "
        f"({out['warm_per_s']} vs {out['in_process_per_s']} attempts/s, {args.store})"
    )


if __name__ == "__main__":
    main()
