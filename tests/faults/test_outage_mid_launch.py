"""The store goes away between a job's start and its recovery-metadata write: the job runs once.

The window: the shell executor has recorded its launch intent and started the job's process, and
is about to write the job's recovery metadata when the store stops answering (a full disk under
SQLite, a crashed PostgreSQL server). Before, that write's failure failed the attempt (a retry
spent) and stopped the job, whose command may already have run: the retry ran it again. Now the
job is left alone, the daemon keeps the attempt's lease until the store answers, then releases it,
and recovery adopts the job by its launch intent. Strict: the job's side effect happens once, in
one attempt, with no failure counted.

The window is held open with the test plugin's fault switch (``shell.after_spawn:sleep=…``), so
the store is taken away while the job runs and before the write is sent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon.conftest import Daemon, wait_for
from tests.faults._pgserver import PrivateServer
from tests.faults.test_full_disk import _fill, small_disk  # noqa: F401

INTERRUPTED = "attempt observation interrupted by the store outage"
#: Long enough for the test to see the job start and take the store away.
WINDOW = {"CONDUIT_TEST_FAULT": "shell.after_spawn:sleep=3"}
#: The job outlives the window and the outage: it is running when its metadata write fails (a
#: job stopped then would never write its end; one run again would start twice).
JOB_SECONDS = 8


def _runs_once_across_the_outage(
    daemon: Daemon, take_store_away: Callable[[], None], bring_store_back: Callable[[], None]
) -> None:
    daemon.start(env=WINDOW)
    work_id = daemon.submit("sleeper")
    wait_for("the job to start", lambda: daemon.runs(work_id, "start") == 1)
    take_store_away()
    # The store stays away until the launch's metadata write has met the outage.
    wait_for("the launch to meet the outage", lambda: INTERRUPTED in daemon.log(), 30)
    bring_store_back()
    detail = daemon.wait_status(work_id, "completed", timeout=90)
    assert (daemon.runs(work_id, "start"), daemon.runs(work_id, "end")) == (1, 1), daemon.log()
    assert len(detail.attempts) == 1, detail.attempts
    assert detail.work.failure_count == 0
    attempt = detail.attempts[0]
    assert attempt.epoch > 1, "the attempt was not recovered"  # adopted under a newer epoch
    log = daemon.log()
    assert "store unavailable (" in log, log
    assert "Traceback" not in log, log


def test_sqlite_disk_full_between_start_and_metadata(
    tmp_path: Path, small_disk: Path, daemons: list[Daemon]  # noqa: F811
) -> None:
    daemon = Daemon(tmp_path, str(small_disk / "conduit.db"), name="d1", sleep=JOB_SECONDS)
    daemons.append(daemon)
    filler = small_disk / "filler"
    _runs_once_across_the_outage(daemon, lambda: _fill(filler, leave=0), filler.unlink)


@pytest.mark.postgres
def test_postgres_down_between_start_and_metadata(
    tmp_path: Path, private_pg: PrivateServer, private_pg_url: str, daemons: list[Daemon]
) -> None:
    daemon = Daemon(tmp_path, private_pg_url, name="d1", sleep=JOB_SECONDS)
    daemons.append(daemon)
    _runs_once_across_the_outage(daemon, private_pg.stop, private_pg.start)
