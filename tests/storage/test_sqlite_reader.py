"""SQLite reads run on a connection of their own: a read never waits behind a write.

The writer holds its connection through a whole batch, disk sync included; a read (admission's
dry run, a Work's pending input, the API's pages) goes to a second connection, which in WAL mode
reads the last committed state while the write goes on.
"""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from conduit_core.model import WorkKind
from conduit_core.storage import open_store
from conduit_core.storage._sql import Cx
from conduit_core.storage._sqlite import SqliteStore
from conduit_core.storage.conformance import make_input, make_work

pytestmark = pytest.mark.anyio


async def test_a_read_completes_while_a_write_transaction_is_open(tmp_path: Path) -> None:
    store = await open_store(f"sqlite://{tmp_path / 'c.db'}")
    assert isinstance(store, SqliteStore)
    try:
        await store.create_work(make_work("w", kind=WorkKind.TASK), first_input=make_input("1"))
        inside, release = threading.Event(), threading.Event()

        def slow_write(cx: Cx) -> None:
            cx.run("UPDATE conduit_work SET ready_since = ready_since WHERE id = ?", ("w",))
            inside.set()
            assert release.wait(30), "the test never released the writer"

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, store.transaction, slow_write)
            assert await anyio.to_thread.run_sync(inside.wait, 30)
            try:
                # The writer is inside its transaction: the read must not wait for it.
                with anyio.fail_after(5):
                    work = await store.get_work("w")
                    pending = await store.first_pending_inputs(["w"])
            finally:
                release.set()
        assert work.id == "w"
        assert list(pending) == ["w"]
    finally:
        await store.aclose()


async def test_a_read_sees_every_write_committed_before_it(tmp_path: Path) -> None:
    store = await open_store(f"sqlite://{tmp_path / 'c.db'}")
    try:
        for i in range(20):
            await store.create_work(make_work(f"w{i}", kind=WorkKind.TASK))
            assert (await store.get_work(f"w{i}")).id == f"w{i}"
    finally:
        await store.aclose()
