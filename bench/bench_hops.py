"""What the event loop's hops cost: a store call's thread hop, a task per call, a write.

    .venv/bin/python bench/bench_hops.py [--n 5000] [--store sqlite|postgres]

Prints, side by side in one run, the CPU per call of:
- a no-op call hopped to a thread by ``anyio.to_thread.run_sync`` and by the store's own
  ``StoreThreads`` (what every store call pays since December, sixth pass);
- a no-op call run as a task of its own (``TaskGroup.start_soon``) and on a ``TaskPool``'s
  reused task (what the host pays per attempt);
- a write transaction of one trivial statement through the store (``Store._write``), which
  includes the hop.
A count of CPU, not a timing of the scheduler: see bench_scheduler.py for attempts per second.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.to_thread
from bench_scheduler import fresh_url  # type: ignore[import-not-found]

from conduit_core.runtime import TaskPool
from conduit_core.storage import open_store
from conduit_core.storage._threads import StoreThreads


async def per_call(name: str, n: int, call: Callable[[], Awaitable[Any]]) -> float:
    for _ in range(min(n, 300)):  # warm up: threads started, statements prepared
        await call()
    cpu = time.process_time()
    for _ in range(n):
        await call()
    us = (time.process_time() - cpu) / n * 1e6
    print(f"{name:<44} {us:7.1f} µs CPU per call")
    return us


async def spawn_per_call(n: int, pooled: bool) -> float:
    async def nothing() -> None:
        pass

    cpu = time.process_time()
    async with anyio.create_task_group() as tg:
        pool = TaskPool(tg)
        for _ in range(n):
            if pooled:
                pool.start_soon(nothing)
            else:
                tg.start_soon(nothing)
            await anyio.lowlevel.checkpoint()
        pool.close()
    us = (time.process_time() - cpu) / n * 1e6
    name = "TaskPool.start_soon (reused task)" if pooled else "TaskGroup.start_soon (a new task)"
    print(f"{name:<44} {us:7.1f} µs CPU per call")
    return us


async def main(n: int, store_kind: str) -> None:
    print(f"anyio {importlib.metadata.version('anyio')}")
    limiter = anyio.CapacityLimiter(8)
    threads = StoreThreads(8, name="bench")
    hop = await per_call(
        "anyio.to_thread.run_sync hop", n,
        lambda: anyio.to_thread.run_sync(lambda: None, limiter=limiter),
    )  # fmt: skip
    own = await per_call("StoreThreads.run hop", n, lambda: threads.run(lambda: None))
    threads.stop()
    print(f"  StoreThreads / to_thread: {own / hop:.2f}x")
    task = await spawn_per_call(n, pooled=False)
    pooled = await spawn_per_call(n, pooled=True)
    print(f"  TaskPool / start_soon: {pooled / task:.2f}x")
    url, keep = fresh_url(store_kind)
    try:
        async with await open_store(url) as store:

            def trivial(cx: Any) -> None:
                cx.run("SELECT 1")

            await per_call(
                f"{store_kind} write transaction (Store._write)", n,
                lambda: store._write(trivial),  # type: ignore[attr-defined]
            )  # fmt: skip
    finally:
        getattr(keep, "cleanup", lambda: None)()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()
    anyio.run(main, args.n, args.store)
