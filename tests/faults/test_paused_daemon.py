"""A daemon paused (SIGSTOP) past its lease while real shell jobs run: a second daemon takes the
attempts over, and the paused one, resumed, is fenced — it writes nothing, runs and stops no
job, and its stale observation of a job that ended meanwhile is discarded."""

from __future__ import annotations

import signal
from collections.abc import Callable

from tests.daemon.conftest import Daemon, job_processes, wait_for

LEASE_S = 2


def _taken_over(daemon: Daemon, work_id: str) -> bool:
    attempt = daemon.show(work_id).attempts[-1]
    return attempt.epoch >= 2 and str(attempt.status) == "running"


def _let_go(daemon: Daemon, execution_id: str) -> bool:
    log = daemon.log()
    return (
        f"attempt lost its lease execution={execution_id} epoch=1" in log
        or f"interrupted by the store outage execution={execution_id} epoch=1" in log
    )


def test_paused_daemon_is_fenced_after_a_takeover(make_daemon: Callable[..., Daemon]) -> None:
    d1 = make_daemon(lease=LEASE_S).start()
    ended_while_paused = [d1.submit("held") for _ in range(2)]
    running_at_resume = [d1.submit("held") for _ in range(2)]
    works = ended_while_paused + running_at_resume
    executions = {}
    for work_id in works:
        executions[work_id] = d1.wait_attempt(work_id, "running").attempts[-1].id
        wait_for(f"{work_id} to start", lambda w=work_id: d1.runs(w, "start") == 1)

    d1.pause_between_transactions()
    try:
        d2 = make_daemon(lease=LEASE_S).start()
        for work_id in works:
            wait_for(f"{work_id} taken over by d2", lambda w=work_id: _taken_over(d2, w))
        for work_id in ended_while_paused:
            d2.release(work_id)
        for work_id in ended_while_paused:
            d2.wait_status(work_id, "completed")
        log_before_resume = d1.log()
    finally:
        d1.signal(signal.SIGCONT)

    # Resumed, d1 finds every lease superseded: its renewals and its observations are refused
    # (or, on PostgreSQL, the server ended the session it was paused in, mid-transaction).
    for execution_id in executions.values():
        wait_for(f"d1 to see that it lost {execution_id}", lambda e=execution_id: _let_go(d1, e))
    resumed_log = d1.log()[len(log_before_resume) :]
    assert "attempt ended" not in resumed_log, resumed_log  # no stale outcome recorded
    # The jobs d2 still observes were neither stopped nor started again by d1.
    for work_id in running_at_resume:
        assert job_processes(executions[work_id]), f"{work_id}'s job was stopped by d1"
        d2.release(work_id)

    for work_id in works:
        detail = d2.wait_status(work_id, "completed")
        (attempt,) = detail.attempts  # adopted, never a second attempt
        assert attempt.epoch == 2, attempt
        assert attempt.segments[-1].recovered
        assert not any(s.relaunched for s in attempt.segments)
        assert (d2.runs(work_id, "start"), d2.runs(work_id, "end")) == (1, 1), work_id
    # d1 is still a working daemon: new Work runs once.
    fresh = d1.submit("ok")
    d1.wait_status(fresh, "completed")
    assert d1.runs(fresh) == 1
