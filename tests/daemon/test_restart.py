"""Handing attempts over: SIGTERM releases leases (jobs keep running and are adopted), SIGKILL
leaves them to expire (and they are recovered); each job runs exactly once. SIGHUP reloads."""

from __future__ import annotations

import signal
from collections.abc import Callable

import psutil

from tests.daemon.conftest import Daemon, job_processes, wait_for


def _start_held_jobs(daemon: Daemon, n: int) -> dict[str, str]:
    """Jobs that run until the test releases them (no race with a fixed duration)."""
    works = [daemon.submit("held") for _ in range(n)]
    executions = {}
    for work_id in works:
        executions[work_id] = daemon.wait_attempt(work_id, "running").attempts[-1].id
        wait_for(f"{work_id} to start", lambda w=work_id: daemon.runs(w, "start") == 1)
    return executions


def _adopted(daemon: Daemon, work_id: str) -> bool:
    attempt = daemon.show(work_id).attempts[-1]
    return attempt.epoch >= 2 and attempt.status == "running"


def test_sigterm_then_restart_adopts_running_jobs(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    executions = _start_held_jobs(daemon, 2)
    assert all(job_processes(e) for e in executions.values())

    daemon.signal(signal.SIGTERM)
    assert daemon.wait_exit() == 0
    assert "lease released" in daemon.log()
    # The detached jobs outlive the daemon.
    assert all(job_processes(e) for e in executions.values())

    daemon.start()
    for work_id in executions:
        wait_for(f"{work_id} to be adopted", lambda w=work_id: _adopted(daemon, w))
        daemon.release(work_id)
    for work_id in executions:
        detail = daemon.wait_status(work_id, "completed")
        (attempt,) = detail.attempts  # adopted, never relaunched
        assert attempt.epoch == 2
        assert attempt.segments[-1].recovered
        assert not attempt.segments[-1].relaunched
        assert daemon.runs(work_id, "start") == 1
        assert daemon.runs(work_id, "end") == 1


def test_sigkill_then_restart_recovers_running_jobs(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon(lease=2).start()
    executions = _start_held_jobs(daemon, 2)
    daemon.signal(signal.SIGKILL)
    daemon.wait_exit()
    assert (daemon.data / "daemon.pid").exists()  # a stale pid file does not block the restart

    daemon.start()
    for work_id in executions:
        wait_for(f"{work_id} to be recovered", lambda w=work_id: _adopted(daemon, w))
        daemon.release(work_id)
    for work_id in executions:
        detail = daemon.wait_status(work_id, "completed", timeout=45)
        (attempt,) = detail.attempts
        assert attempt.epoch >= 2
        assert any(s.recovered for s in attempt.segments)
        assert daemon.runs(work_id, "start") == 1
        assert daemon.runs(work_id, "end") == 1


def test_second_signal_exits_at_once(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    daemon.submit("forever")
    wait_for("the job to start", lambda: daemon.side.exists())
    # Two different signals: two of the same kind may be merged by the kernel into one.
    daemon.signal(signal.SIGINT)
    daemon.signal(signal.SIGTERM)
    assert daemon.wait_exit() == 1
    assert "exiting at once" in daemon.log()


def test_reload_pins_live_attempts_and_applies_to_new_ones(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon().start()
    before = daemon.submit("forever")
    first = daemon.wait_attempt(before, "running").attempts[-1]
    assert first.config_generation == 1

    daemon.write_config(extra='[bindings.added]\nexecutor = "echo"\n')
    daemon.cli("reload")
    wait_for("the reload", lambda: "config reloaded" in daemon.log())
    after = daemon.submit("added")
    added = daemon.wait_status(after, "completed").attempts[-1]
    assert added.config_generation == 2
    live = daemon.show(before).attempts[-1]
    assert (live.status, live.config_generation) == ("running", 1)

    # A broken config is refused; the running one stays.
    daemon.config.write_text(daemon.config.read_text() + "\n[bogus]\n")
    daemon.signal(signal.SIGHUP)
    wait_for("the refusal", lambda: "reload refused" in daemon.log())
    assert daemon.show(daemon.submit("added")).work.binding == "added"
    for proc in job_processes(live.id):
        psutil.Process(proc.pid).kill()
