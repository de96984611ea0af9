"""A backlog far larger than the free slots, through a real daemon: claims read only the ready
Work there is room for, and what waits, and for which limit, still shows right.

Before, every claim read 64 ready rows whatever was free and checked each refused row with two
more statements (a hold read and a slot-holder read), on every pass, so a backlog made every
claim pay over a hundred statements to start a handful of jobs. On PostgreSQL the table
statistics count how often the hold table was probed: a probe per row a claim read.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import psycopg

from tests.daemon.conftest import Daemon, wait_for
from tests.daemon.test_metrics import samples, value

JOBS, LIMIT = 40, 4  # LIMIT is `job_concurrency` in tests/daemon/conftest.py's config


def _hold_probes(url: str) -> int:
    """Index and sequential scans of the hold table since the database was made (every backend
    that read it has ended, so its counts are flushed)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COALESCE(idx_scan, 0) + COALESCE(seq_scan, 0) FROM pg_stat_user_tables "
            "WHERE relname = 'conduit_hold'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _jobs_pool(daemon: Daemon) -> dict[str, int]:
    status, view = daemon.raw("GET", "/v1/capacity")
    assert status == 200, view
    pool: dict[str, int] = next(p for p in view["pools"] if p["name"] == "jobs")
    return pool


def test_a_backlog_claims_only_free_slots_and_shows_what_waits(
    make_daemon: Callable[..., Daemon], store: str
) -> None:
    daemon = make_daemon().start(rescan=0.05)
    ids = [daemon.submit("held", id=f"j{i:02d}") for i in range(JOBS)]

    def started() -> list[str]:
        return [work_id for work_id in ids if daemon.runs(work_id, "start")]

    first = wait_for(f"{LIMIT} jobs to start", lambda: len(started()) >= LIMIT and started())
    pool = wait_for("the waiting count", lambda: (p := _jobs_pool(daemon))["waiting"] and p)
    assert (pool["in_use"], pool["limit"], pool["waiting"]) == (LIMIT, LIMIT, JOBS - LIMIT)
    waiting = daemon.show(next(i for i in ids if i not in first)).waiting
    assert waiting is not None
    assert (waiting.code, waiting.limit_name) == ("capacity_job_concurrency", "jobs")
    assert daemon.show(first[0]).waiting is None  # running: waits for nothing
    # The queue's depth, per binding, in the health answer and in /metrics.
    status, health = daemon.raw("GET", "/v1/health")
    assert status == 200, health
    assert health["ready_depth"] == {"held": JOBS - LIMIT}
    found = samples(daemon)
    assert value(found, "conduit_work_ready_depth", binding="held", pool="jobs") == JOBS - LIMIT
    assert value(found, "conduit_work_ready_depth", binding="ok", pool="jobs") == 0

    for work_id in ids:
        daemon.release(work_id)
    wait_for(f"{JOBS} jobs to end", lambda: all(daemon.runs(i, "end") for i in ids), 120)
    assert all(daemon.runs(i, "start") == 1 for i in ids), "a job ran twice"
    assert _jobs_pool(daemon)["waiting"] == 0
    # Every first attempt's submit-to-start wait was measured: a histogram, no store read.
    found = samples(daemon)
    assert value(found, "conduit_work_submit_to_start_seconds_count", binding="held") == JOBS
    daemon.signal(signal.SIGTERM)
    assert daemon.wait_exit() == 0

    if "://" in store:  # SQLite keeps no such statistics
        # Per Work: one probe when it is submitted (the answer shows its holds), two when it
        # is claimed (the ready read, then the claim once the start gates were asked), and a
        # few more reads of a claim that raced a settlement: some 150 in all. The old claim
        # read every ready row (up to 64) on every pass and every claim, the pool full or not:
        # 1,244 probes for these 40 jobs when measured.
        probes = _hold_probes(store)
        assert probes <= 5 * JOBS, f"{probes} hold probes to start {JOBS} jobs"
