"""SQLite: reads queue for the one reader connection on a thread of their own, so a write
batch never waits behind them for a thread.

The store had two threads for everything: two reads waiting on the reader connection (one
behind the other) took both, and every write waited until one of them was done.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import anyio
import pytest

from conduit_core.storage import open_store
from conduit_core.storage._sqlite import SqliteStore
from conduit_core.storage.conformance import make_work

#: How long the reader stays busy; a write that waited for it took at least this long.
READER_BUSY_S = 3.0


@pytest.mark.anyio
async def test_a_write_commits_while_reads_wait_for_the_reader(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "conduit.db")
    assert isinstance(store, SqliteStore)
    try:
        await store.create_work(make_work("before"))
        reads_done: list[str] = []
        store._read_lock.acquire()  # the reader is busy (a long read, say) for a while
        releaser = threading.Timer(READER_BUSY_S, store._read_lock.release)
        releaser.start()
        async with anyio.create_task_group() as tg:

            async def read(tag: str) -> None:
                await store.get_work("before")
                reads_done.append(tag)

            tg.start_soon(read, "a")
            tg.start_soon(read, "b")
            await anyio.sleep(0.05)  # both reads are queued or waiting on the reader
            started = time.monotonic()
            created = await store.create_work(make_work("during"))
            took = time.monotonic() - started
            assert created.id == "during"
            assert reads_done == [], "the write waited for the reads"
            assert took < READER_BUSY_S / 2, f"the write took {took:.2f} s"
        releaser.join()
        assert sorted(reads_done) == ["a", "b"]
    finally:
        await store.aclose()
