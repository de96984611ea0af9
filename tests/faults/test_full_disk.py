"""A full disk under the SQLite store (a small tmpfs): a clear coded error, nothing stored, no
corruption (``PRAGMA integrity_check``), and the daemon carries on when space returns.

The Work that fills the disk waits for capacity (two running jobs hold its scope's slots), so
no job launches while the disk is full: a launch whose recovery-metadata write meets the full
disk is ``test_outage_mid_launch.py``'s case, not this test of the store.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from tests._ci import unavailable
from tests.daemon.conftest import Daemon, wait_for

PAYLOAD = "x" * 48_000  # an input big enough to fill what the filler leaves in a few submits


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs (SQLite checkpoints its WAL at 4 MiB) mounted under the test's folder, unmounted afterwards."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0:
        unavailable("mounting a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        unavailable(f"mount -t tmpfs failed: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path, leave: int) -> None:
    """Write ``path`` until the device has at most ``leave`` bytes free."""
    with path.open("wb") as fh:
        while True:
            stat = os.statvfs(path.parent)
            free = stat.f_bavail * stat.f_frsize
            if free <= leave:
                return
            try:
                fh.write(b"\0" * min(64 * 1024, free - leave))
                fh.flush()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return


def _submit(daemon: Daemon) -> tuple[int, dict[str, object]]:
    body = msgspec.json.encode({"binding": "ok", "scope": "team", "input": {"blob": PAYLOAD}})
    return daemon.raw("POST", "/v1/work", body)


def test_full_disk_under_the_sqlite_store(
    tmp_path: Path, small_disk: Path, daemons: list[Daemon]
) -> None:
    db = small_disk / "conduit.db"
    daemon = Daemon(tmp_path, str(db), name="d1")
    daemons.append(daemon)
    daemon.start()
    holders = [daemon.submit("held", scope="team") for _ in range(2)]  # the scope's 2 slots
    for work_id in holders:
        wait_for(f"{work_id} to start", lambda w=work_id: daemon.runs(w, "start") == 1)
    _fill(small_disk / "filler", leave=600_000)

    accepted: list[str] = []
    refusal: dict[str, object] | None = None
    for _ in range(200):
        status, body = _submit(daemon)
        if status == 503:
            refusal = body
            break
        assert status in (200, 201), body
        accepted.append(str(body["work"]["id"]))  # type: ignore[index]
    assert refusal is not None, f"the disk never filled up after {len(accepted)} submits"
    assert accepted, "the disk was full before the first submit: the filler left too little"
    assert refusal["code"] == "store_full", refusal
    assert "no space left" in str(refusal["error"]), refusal
    assert str(db) in str(refusal["error"]), refusal
    assert daemon.proc is not None
    assert daemon.proc.poll() is None, daemon.log()
    # The refused submit stored nothing, and the file is intact while the disk is still full.
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("SELECT count(*) FROM conduit_work").fetchone() == (len(accepted) + 2,)

    (small_disk / "filler").unlink()  # space returns
    status, body = _submit(daemon)
    assert status in (200, 201), body
    accepted.append(str(body["work"]["id"]))  # type: ignore[index]
    for work_id in holders:
        daemon.release(work_id)
        daemon.wait_status(work_id, "completed", timeout=60)
        assert (daemon.runs(work_id, "start"), daemon.runs(work_id, "end")) == (1, 1)
    for work_id in accepted:
        detail = daemon.wait_status(work_id, "completed", timeout=60)
        assert len(detail.attempts) == 1, work_id
        assert daemon.runs(work_id) == 1, work_id
    # The host logged each outage it met (a pass, or a holder's launch write caught between
    # its spawn and its metadata) once, and its end as often.
    log = daemon.log()
    assert log.count("store unavailable (") == log.count("store available again"), log
    assert "Traceback" not in log, log

    daemon.signal(15)
    assert daemon.wait_exit() == 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("SELECT count(*) FROM conduit_work").fetchone() == (len(accepted) + 2,)
