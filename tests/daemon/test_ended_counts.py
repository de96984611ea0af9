"""``/metrics``' counts of ended Work are re-read only when older than 100 times what their last
read took (``http._metrics.EndedCounts``), so a long history costs scrapes at most a hundredth
of the time, while a store with little history is counted afresh at every scrape
(``test_metrics.py`` sees a completion at the next scrape).

A real SQLite store; the clock is the test's, and the read's duration is set by advancing it
while the store counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest

from conduit_core.http._metrics import EndedCounts
from conduit_core.model import WorkStatus
from conduit_core.storage import open_store
from conduit_core.storage.conformance import make_work

pytestmark = pytest.mark.anyio


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0
        self.reads = 0

    def __call__(self) -> float:
        return self.now


class _Timed:
    """The store, whose count of ended Work takes ``took`` seconds of the test's clock."""

    def __init__(self, store: Any, clock: _Clock, took: float) -> None:
        self.store, self.clock, self.took = store, clock, took

    async def ended_work_counts(self) -> dict[str, int]:
        self.clock.reads += 1
        counts: dict[str, int] = await self.store.ended_work_counts()
        await anyio.lowlevel.checkpoint()  # another scrape may come in meanwhile
        self.clock.now += self.took
        return counts


async def _end(store: Any, names: list[str]) -> None:
    ended = [(msgspec.structs.replace(make_work(n), status=WorkStatus.COMPLETED), None)
             for n in names]  # fmt: skip
    await store.create_works(ended)


async def test_ended_counts_are_read_again_once_older_than_a_hundred_times_their_read(
    tmp_path: Path,
) -> None:
    clock = _Clock()
    counts = EndedCounts(clock)
    async with await open_store(tmp_path / "s.db") as real:
        store = _Timed(real, clock, took=0.5)
        await _end(real, ["a", "b"])
        found, age = await counts.read(store)  # type: ignore[arg-type]
        assert (found["completed"], age, clock.reads) == (2, 0.0, 1)

        await _end(real, ["c"])
        clock.now += 49.0  # 49.5 s after the read that took 0.5 s: not due
        found, age = await counts.read(store)  # type: ignore[arg-type]
        assert (found["completed"], age, clock.reads) == (2, 49.0, 1)

        clock.now += 1.0  # 50 s: due
        found, age = await counts.read(store)  # type: ignore[arg-type]
        assert (found["completed"], age, clock.reads) == (3, 0.0, 2)

        # A read that got quicker is due sooner: 0.01 s read, due 1 s later.
        store.took = 0.01
        clock.now += 50.0
        await counts.read(store)  # type: ignore[arg-type]
        await _end(real, ["d"])
        clock.now += 1.0
        found, _ = await counts.read(store)  # type: ignore[arg-type]
        assert (found["completed"], clock.reads) == (4, 4)

        # Scrapes that come in together while a read is due share the one read.
        clock.now += 5.0
        results: list[dict[str, int]] = []

        async def scrape() -> None:
            results.append((await counts.read(store))[0])  # type: ignore[arg-type]

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(scrape)
        assert clock.reads == 5
        assert all(r["completed"] == 4 for r in results)

    # Another store (a reload that opened a new one) is counted afresh whatever the age.
    async with await open_store(tmp_path / "other.db") as other:
        found, age = await counts.read(_Timed(other, clock, took=0.5))  # type: ignore[arg-type]
        assert (found["completed"], age, clock.reads) == (0, 0.0, 6)
