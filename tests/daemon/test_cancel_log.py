"""An operator's cancel or interrupt of a running attempt is logged as what it is, at INFO; only a
real loss of the lease (fenced without a cancel) is a WARNING. Through a real daemon, on both
stores, with short leases so that renewals land inside the cancel's window too."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import psycopg

from tests.daemon.conftest import Daemon, wait_for

LEASE_S = 1.5  # renewed every 0.5 s: some cancels race a renewal, some race the settle


def _lines(daemon: Daemon, execution_id: str) -> list[str]:
    return [line for line in daemon.log().splitlines() if f"execution={execution_id} " in line]


def _running(daemon: Daemon, binding: str) -> tuple[str, str]:
    work_id = daemon.submit(binding)
    execution_id = daemon.wait_attempt(work_id, "running", timeout=60).attempts[-1].id
    wait_for(f"{work_id} to start", lambda: daemon.runs(work_id, "start") == 1, timeout=60)
    return work_id, execution_id


def _drop_lease(store: str, execution_id: str) -> None:
    """Take the lease away behind the daemon's back: a real loss, no cancel recorded."""
    sql = "UPDATE conduit_execution SET lease_token = NULL WHERE id = "
    if "://" in store:
        with psycopg.connect(store, autocommit=True) as conn:
            conn.execute(sql + "%s", (execution_id,))
        return
    conn = sqlite3.connect(store, timeout=10, isolation_level=None)
    try:
        conn.execute(sql + "?", (execution_id,))
    finally:
        conn.close()


def test_a_cancel_is_logged_at_info_and_a_real_lease_loss_at_warning(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(lease=LEASE_S).start()
    cancelled = [_running(daemon, "forever") for _ in range(3)]
    interrupted = _running(daemon, "forever")
    for work_id, _ in cancelled:
        status, _body = daemon.raw("POST", f"/v1/work/{work_id}/cancel", b"{}")
        assert status == 200
    status, _body = daemon.raw("POST", f"/v1/work/{interrupted[0]}/interrupt", b"{}")
    assert status == 202  # accepted: the stop is dispatched to the executor

    expected = [(eid, "its Work was cancelled") for _, eid in cancelled]
    expected.append((interrupted[1], "interrupted by an operator"))
    for execution_id, why in expected:
        line = f"INFO conduit.daemon: attempt cancelled execution={execution_id} epoch=1: {why}"
        wait_for(f"the cancel of {execution_id} in the log", lambda want=line: want in daemon.log())
    for execution_id, _ in expected:
        noisy = [line for line in _lines(daemon, execution_id) if " WARNING " in line]
        assert noisy == [], noisy

    # Negative control: the same daemon still warns when a lease is really lost.
    _, lost = _running(daemon, "forever")
    _drop_lease(daemon.store, lost)
    wait_for(
        f"the loss of {lost}'s lease in the log",
        lambda: any(
            " WARNING conduit.daemon: attempt lost its lease " in line
            for line in _lines(daemon, lost)
        ),
    )
