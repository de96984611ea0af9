"""The cost of ``/metrics``' queue gauges with many ready Work: ``ready_depth`` (depth per
binding, ``GET /v1/health``), ``ready_summary`` (depth and oldest ready age per binding),
``capacity_waiting`` (what waits for which limit) and ``work_counts`` (Work per status and
how many could start).

    .venv/bin/python bench/bench_ready_metrics.py                       # 100,000 ready Work, SQLite
    .venv/bin/python bench/bench_ready_metrics.py --work 20000 --store postgresql:///conduit_bench

Fills a fresh store with ``--work`` ready Work (each with its first input, over 10 bindings) and
prints the median and max time of each read over ``--reads`` reads. A PostgreSQL URL must name an
empty database.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from conduit_core.model import Event, Work
from conduit_core.storage import CapacityLimits, open_store


async def _fill(url: str, count: int) -> None:
    store = await open_store(url)
    try:
        for start in range(0, count, 1000):
            items = []
            for n in range(start, min(start + 1000, count)):
                now = 1_700_000_000_000 + n
                work = Work(id=f"w{n:08d}", scope="root", binding=f"b{n % 10}",
                            created_at_ms=now, updated_at_ms=now)  # fmt: skip
                first = Event(id=f"w{n:08d}/input/1", delivery_id=f"w{n:08d}/input/1",
                              type="core.input", work_id=work.id, scope="root", pending=True,
                              accepted_at_ms=now)  # fmt: skip
                items.append((work, first))
            await store.create_works(items)
    finally:
        await store.aclose()


async def _time(url: str, reads: int) -> dict[str, list[float]]:
    store = await open_store(url)
    limits = CapacityLimits(global_limit=8)
    reads_by_name = {
        "ready_depth": store.ready_depth,
        "ready_summary": store.ready_summary,
        "capacity_waiting": lambda: store.capacity_waiting(limits),
        "work_counts": store.work_counts,
    }
    out: dict[str, list[float]] = {name: [] for name in reads_by_name}
    try:
        for _ in range(reads):
            for name, read in reads_by_name.items():
                began = time.perf_counter()
                await read()
                out[name].append((time.perf_counter() - began) * 1000)
        summary = await store.ready_summary()
        assert sum(n for n, _ in summary.values()) == sum((await store.ready_depth()).values())
    finally:
        await store.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=int, default=100_000)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--store", default=None, help="store URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = args.store or str(Path(folder) / "bench.db")
        began = time.perf_counter()
        anyio.run(_fill, url, args.work)
        print(f"filled {args.work:,} ready Work in {time.perf_counter() - began:.1f} s")
        times = anyio.run(_time, url, args.reads)
        for name, ms in times.items():
            print(f"{name:16s} median {statistics.median(ms):8.1f} ms   max {max(ms):8.1f} ms")


if __name__ == "__main__":
    main()
