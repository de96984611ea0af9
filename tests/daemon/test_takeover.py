"""A daemon restarted after ``kill -9`` takes over its dead predecessor's leases at once; the
leases of a live owner, or of one on another host, still wait for their expiry.

Real daemons, real shell jobs, both stores (the ``store`` fixture). The leases are long (120 s)
where the takeover must be immediate, so adoption well before expiry can only come from it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from tests.daemon.conftest import Daemon, wait_for

LONG_LEASE = 120


def _start_held_jobs(daemon: Daemon, n: int) -> list[str]:
    works = [daemon.submit("held") for _ in range(n)]
    for work_id in works:
        daemon.wait_attempt(work_id, "running")
        wait_for(f"{work_id} to start", lambda w=work_id: daemon.runs(w, "start") == 1)
    return works


def _epoch(daemon: Daemon, work_id: str) -> tuple[int, str]:
    attempt = daemon.show(work_id).attempts[-1]
    return attempt.epoch, str(attempt.status)


def _adopted(daemon: Daemon, work_id: str) -> bool:
    return _epoch(daemon, work_id) == (2, "running")


def _recovered_only_after_expiry(
    daemon: Daemon, works: list[str], silent_since: float, lease: float
) -> None:
    """The owner went silent at ``silent_since`` (monotonic) after a renewal at most a third of
    a lease earlier, so its leases live until at least ``silent_since + 2/3 lease``: nothing may
    be recovered before that; afterwards ``daemon`` recovers every attempt."""
    while time.monotonic() < silent_since + lease * 2 / 3 - 1:
        assert all(_epoch(daemon, w)[0] == 1 for w in works), "recovered before expiry"
        time.sleep(0.2)
    for work_id in works:
        wait_for(f"{work_id} adopted", lambda w=work_id: _adopted(daemon, w), timeout=60)
    assert "is dead" not in daemon.log()


def _finish(daemon: Daemon, works: list[str]) -> None:
    for work_id in works:
        daemon.release(work_id)
    for work_id in works:
        (attempt,) = daemon.wait_status(work_id, "completed", timeout=60).attempts
        assert attempt.epoch == 2
        assert attempt.segments[-1].recovered
        assert not attempt.segments[-1].relaunched
        assert daemon.runs(work_id, "start") == 1
        assert daemon.runs(work_id, "end") == 1


def test_a_restart_takes_over_a_killed_predecessors_leases_at_once(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(lease=LONG_LEASE).start()
    works = _start_held_jobs(daemon, 3)
    killed_at = time.monotonic()
    daemon.signal(signal.SIGKILL)
    daemon.wait_exit()

    daemon.start()
    for work_id in works:
        wait_for(f"{work_id} adopted", lambda w=work_id: _adopted(daemon, w), timeout=60)
    # Long before the leases (renewed at most LONG_LEASE / 3 before the kill) could expire.
    assert time.monotonic() - killed_at < LONG_LEASE * 2 / 3
    assert "is dead: its 3 lease(s) released for recovery" in daemon.log()
    _finish(daemon, works)


def test_the_leases_of_an_owner_on_another_host_wait_for_their_expiry(
    make_daemon: Callable[..., Daemon],
) -> None:
    """Negative control: the same kill, but the pid file names another host: nothing proves
    that owner dead, so its leases are recovered only once they expire."""
    lease = 15
    daemon = make_daemon(lease=lease).start()
    works = _start_held_jobs(daemon, 2)
    killed_at = time.monotonic()  # no renewal after this: expiry within `lease` seconds
    daemon.signal(signal.SIGKILL)
    daemon.wait_exit()
    pid_file = daemon.data / "daemon.pid"
    text = pid_file.read_text()
    assert "\nhost " in text
    assert "\nowner " in text
    pid_file.write_text(
        "\n".join(
            "host elsewhere.example" if line.startswith("host ") else line
            for line in text.splitlines()
        )
        + "\n"
    )

    daemon.start()
    _recovered_only_after_expiry(daemon, works, killed_at, lease)
    _finish(daemon, works)


def test_a_live_owners_leases_are_not_taken_over(make_daemon: Callable[..., Daemon]) -> None:
    """Negative control: a second daemon on the same store while the first is alive but paused
    (SIGSTOP: it cannot renew) recovers the first one's attempts only at their expiry."""
    lease = 15
    first = make_daemon(lease=lease).start()
    works = _start_held_jobs(first, 2)
    stopped_at = time.monotonic()
    first.pause_between_transactions()
    try:
        second = make_daemon(lease=lease).start()
        _recovered_only_after_expiry(second, works, stopped_at, lease)
    finally:
        first.kill()  # SIGKILL reaches a stopped process
    _finish(second, works)
