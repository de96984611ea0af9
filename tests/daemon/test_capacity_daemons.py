"""Two daemons share one store and one `job_concurrency`: never more jobs alive than the limit.

Measured from the jobs themselves: each shell job appends "<id> start" when it begins and
"<id> end" just before it exits, to one file shared by both daemons' jobs. Appends land in the
order they happen, so walking the file counts exactly how many jobs were between their start
and end at each moment, and a job process is alive through that whole span. The negative
control runs the same with the store's capacity check switched off (`CONDUIT_TEST_UNSAFE`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.daemon.conftest import Daemon, wait_for

JOBS, LIMIT = 16, 4  # LIMIT is `job_concurrency` in tests/daemon/conftest.py's config


def _peak_alive(daemon: Daemon) -> int:
    alive = peak = 0
    for line in daemon.side.read_text().splitlines():
        word = line.split()[1]
        alive += 1 if word == "start" else -1 if word == "end" else 0
        peak = max(peak, alive)
    return peak


def _waiting_for_jobs(daemon: Daemon) -> int:
    status, view = daemon.raw("GET", "/v1/capacity")
    assert status == 200, view
    return next(int(p["waiting"]) for p in view["pools"] if p["name"] == "jobs")


def _run_held_jobs(make_daemon: Callable[..., Daemon]) -> tuple[Daemon, int]:
    """Submit held jobs to two daemons; once no further job can start, release them all."""
    first, second = make_daemon().start(rescan=0.2), make_daemon().start(rescan=0.2)
    ids = [(first, second)[i % 2].submit("held", id=f"j{i:02d}") for i in range(JOBS)]

    def started() -> int:
        return sum(first.runs(work_id, "start") for work_id in ids)

    def settled() -> bool:
        # Past the limit already, or both daemons' last claim pass refused every job not
        # running for capacity: nothing else would start before a release.
        n = started()
        return n > LIMIT or (
            n == LIMIT and all(_waiting_for_jobs(d) == JOBS - n for d in (first, second))
        )

    wait_for("the jobs pool to fill and both daemons to be refused the rest", settled, 60)
    for work_id in ids:
        first.release(work_id)
    wait_for(f"{JOBS} jobs to end", lambda: all(first.runs(i, "end") for i in ids), 120)
    return first, _peak_alive(first)


@pytest.mark.slow
def test_two_daemons_never_run_more_jobs_than_job_concurrency(
    make_daemon: Callable[..., Daemon],
) -> None:
    first, peak = _run_held_jobs(make_daemon)
    assert peak <= LIMIT, f"{peak} jobs alive at once, job_concurrency is {LIMIT}"
    assert peak == LIMIT, f"the pool was never full (peak {peak}): the test proved nothing"
    for i in range(JOBS):
        assert first.runs(f"j{i:02d}", "start") == 1  # each ran once


@pytest.mark.slow
def test_negative_control_without_the_capacity_check_the_limit_is_exceeded(
    make_daemon: Callable[..., Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDUIT_TEST_UNSAFE", "capacity_check")  # inherited by both daemons
    _, peak = _run_held_jobs(make_daemon)
    assert peak > LIMIT, f"peak {peak}: the measurement cannot see an exceeded limit"
