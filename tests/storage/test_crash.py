"""A process killed with SIGKILL inside a transaction leaves the store consistent and openable."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conduit_core.storage import ClaimRequest, SqlStore, open_store
from conduit_core.storage.conformance import make_work, snapshot

pytestmark = pytest.mark.anyio

# The child commits one Work, then in a second transaction creates another Work, accepts input
# and claims an attempt, signals the test through a file and waits to be killed.
_CHILD = """
import sys, threading
from pathlib import Path
from conduit_core.storage import ClaimRequest, open_store_sync
from conduit_core.storage import _ops_work as ops
from conduit_core.storage.conformance import make_input, make_work, snapshot

url, signal_file = sys.argv[1], Path(sys.argv[2])
store = open_store_sync(url)
store.transaction(
    lambda cx: ops.create_work(cx, make_work("committed"), make_input("committed"))
)

def half_done(cx):
    ops.create_work(cx, make_work("torn"), None)
    ops.claim_attempts(cx, [ClaimRequest(work_id="committed", snapshot=snapshot())], "child",
                       1_000_000, 10_000, None)
    signal_file.write_text("in transaction")
    threading.Event().wait()

store.transaction(half_done)
"""


def _wait_for(path: Path, child: subprocess.Popen[bytes], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the child never reached its transaction"
        time.sleep(0.01)


async def test_sigkill_mid_transaction_leaves_store_consistent(
    store_url: str, tmp_path: Path
) -> None:
    signal_file = tmp_path / "signal"
    child = subprocess.Popen(  # noqa: ASYNC220 - started once, never waited on in the loop
        [sys.executable, "-c", _CHILD, store_url, str(signal_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(signal_file, child)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=30)  # reaps it and closes the pipes
    assert child.returncode == -signal.SIGKILL

    store = await open_store(store_url)
    try:
        assert isinstance(store, SqlStore)
        assert [w.id for w in await store.list_work()] == ["committed"]
        assert await store.list_executions("committed") == []
        # The store still works: the torn claim's attempt number is free again.
        claim = await store.claim_attempt(
            ClaimRequest(work_id="committed", snapshot=snapshot()),
            owner="survivor",
            now_ms=2_000_000,
            lease_ms=10_000,
        )
        assert claim.execution.attempt == 1
        await store.create_work(make_work("torn"))
    finally:
        await store.aclose()
    if store_url.startswith("sqlite://"):
        with sqlite3.connect(store_url[len("sqlite://") :]) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        conn.close()
