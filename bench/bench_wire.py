"""No-op attempts through an out-of-process executor vs the in-process ``echo``, same run.

    .venv/bin/python bench/bench_wire.py --store sqlite --concurrency 64 --n 2000
    .venv/bin/python bench/bench_wire.py --store postgres --concurrency 64 --n 2000

Both go the whole way through the real Scheduler on a real store (claim, fenced launch with its
recovery record, observe, fenced settle). The out-of-process executor is
``bench/wire_echo_program.py`` (the SDK), declared as conduit.toml's ``[executors.NAME]`` does;
each of its attempts costs the frames ``run`` → ``persist_recovery`` → ``callback_ok`` →
``launched`` (with the result inline: the segment ended at once). Printed: attempts/s of each and
their ratio (target: out-of-process at least half of in-process at concurrency 64). The two
alternate over ``--rounds`` so that the load of a shared machine falls on both alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import anyio
from bench_scheduler import enqueue, fresh_url, gates_as_a_user_has_them, process

from conduit_core.config import Binding
from conduit_core.plugins import Plugins
from conduit_core.remote import ProgramSpec
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
from conduit_core.storage import open_store

PROGRAM = Path(__file__).resolve().parent / "wire_echo_program.py"


async def rate(kind: str, executor: str, plugins: Plugins, n: int, concurrency: int) -> float:
    url, tmp = fresh_url(kind)
    try:
        async with await open_store(url) as store:
            sched = Scheduler(
                store, SystemClock(), plugins,
                SchedulerOptions(owner="bench", concurrency=max(concurrency, 1),
                                 bindings={"noop": Binding(executor=executor)}),
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


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    programs = {"wire-echo": ProgramSpec(command=(sys.executable, str(PROGRAM)))}
    gates_as_a_user_has_them()
    plugins = Plugins.load(disabled=(), programs=programs)
    rates: dict[str, list[float]] = {"echo": [], "wire-echo": []}
    try:
        for _ in range(args.rounds):
            for executor in rates:
                rates[executor].append(
                    await rate(args.store, executor, plugins, args.n, args.concurrency)
                )
    finally:
        await plugins.close()
    in_process = statistics.median(rates["echo"])
    out_of_process = statistics.median(rates["wire-echo"])
    return {
        "store": args.store, "n": args.n, "concurrency": args.concurrency, "rounds": args.rounds,
        "in_process_per_s": round(in_process, 1), "out_of_process_per_s": round(out_of_process, 1),
        "ratio": round(out_of_process / in_process, 3),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    out = anyio.run(main_async, args)
    print(json.dumps(out))
    print(
        f"ratio out-of-process / in-process at concurrency {args.concurrency}: {out['ratio']} "
        f"({out['out_of_process_per_s']} vs {out['in_process_per_s']} attempts/s, {args.store})"
    )


if __name__ == "__main__":
    main()
