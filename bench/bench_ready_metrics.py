"""The cost of ``/metrics``' stored-state reads with many ready Work and a long history:
``ready_depth`` (depth per binding, ``GET /v1/health``), ``ready_summary`` (depth and oldest ready
age per binding), ``capacity_waiting`` (what waits for which limit), ``work_counts`` (Work per
open state and how many could start, read at every scrape) and ``ended_work_counts`` (ended Work
per state, read seldom: ``http._metrics.EndedCounts``).

    .venv/bin/python bench/bench_ready_metrics.py                       # 100,000 ready Work, SQLite
    .venv/bin/python bench/bench_ready_metrics.py --work 20000 --store postgresql:///conduit_bench
    .venv/bin/python bench/bench_ready_metrics.py --work 1000 --ended 2000000 --store ...

Fills a fresh store with ``--work`` ready Work (each with its first input, over 10 bindings) and
``--ended`` completed, failed and cancelled Work, and prints the median and max time of each read
over ``--reads`` reads, and of ``every_status``: the one ``GROUP BY status`` over the whole table
that ``work_counts`` was until 7 Dec 2026 (every scrape paid it). A PostgreSQL URL must name an
empty database.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from conduit_core.model import Event, Work, WorkStatus
from conduit_core.storage import CapacityLimits, open_store
from conduit_core.storage._ops_work import work_counts

_ENDED = (WorkStatus.COMPLETED, WorkStatus.FAILED, WorkStatus.CANCELLED)


async def _fill_ended(url: str, count: int) -> None:
    store = await open_store(url)
    try:
        for start in range(0, count, 5000):
            items: list[tuple[Work, Event | None]] = []
            for n in range(start, min(start + 5000, count)):
                now = 1_600_000_000_000 + n
                items.append((Work(id=f"e{n:09d}", scope="root", binding=f"b{n % 10}",
                                   status=_ENDED[n % 3], created_at_ms=now, updated_at_ms=now),
                              None))  # fmt: skip
            await store.create_works(items)
    finally:
        await store.aclose()


def _every_status(cx: object) -> dict[str, int]:
    """``work_counts`` as it was: every Work row read at every scrape."""
    counts = work_counts(cx)  # type: ignore[arg-type]
    for status, count in cx.rows("SELECT status, COUNT(*) FROM conduit_work GROUP BY status"):  # type: ignore[attr-defined]
        counts[str(status)] = int(count)
    return counts


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
        "ended_work_counts": store.ended_work_counts,
        "every_status": lambda: store._read(_every_status),  # type: ignore[attr-defined]
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
    parser.add_argument("--ended", type=int, default=0, help="ended Work added (default 0)")
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--store", default=None, help="store URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = args.store or str(Path(folder) / "bench.db")
        began = time.perf_counter()
        anyio.run(_fill, url, args.work)
        if args.ended:
            anyio.run(_fill_ended, url, args.ended)
        print(f"filled {args.work:,} ready Work and {args.ended:,} ended in "
              f"{time.perf_counter() - began:.1f} s")  # fmt: skip
        times = anyio.run(_time, url, args.reads)
        for name, ms in times.items():
            print(f"{name:16s} median {statistics.median(ms):8.1f} ms   max {max(ms):8.1f} ms")


if __name__ == "__main__":
    main()
