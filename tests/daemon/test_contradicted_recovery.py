"""Issue 33, observations 1 and 10, through a real daemon and a real executor program, on both
stores.

The program (``tests/wire/_lying_program.py``) runs a real detached job and persists its recovery
metadata, then answers every ``recover`` with ``not_started``. Whether the daemon restarts
(SIGKILL) or the program does (SIGKILL; the daemon restarts it), the core does not believe it:
the attempt is held with code ``recovery_contradicted`` — never relaunched, never failed into a
retry — and the job runs once. Held past its deadline, the attempt is stopped through the
program (a verified stop) and timed out; only then does its retry run the job again.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.daemon.conftest import Daemon, wait_for

LIAR = Path(__file__).resolve().parents[1] / "wire" / "_lying_program.py"
# Long enough for a kill and restart on a loaded 2-core machine (the recovery must come before
# the deadline to be held; at load 14 a restart once took more than 8 s).
SHORT_TIMEOUT_S = 20

pytest.importorskip("conduit_example_wire", reason="scripts/setup.sh installs the wire example")


def _extra(root: Path) -> str:
    side = root / "side-effects.log"
    held = (
        f'echo "$CONDUIT_WORK_ID start" >> {side}; '
        f"while test ! -e {root}/release.$CONDUIT_WORK_ID; do sleep 0.05; done; "
        f'echo "$CONDUIT_WORK_ID end" >> {side}'
    )
    return f"""
[executors.liar]
command = ["{sys.executable}", "{LIAR}"]

[bindings.liar-held]
executor = "liar"
retry_delays_seconds = [0.2]
config = {{ command = '{held}' }}

[bindings.liar-held-short]
executor = "liar"
retry_delays_seconds = [0.2]
timeout_seconds = {SHORT_TIMEOUT_S}
config = {{ command = '{held}' }}
"""


def _program_pid(daemon: Daemon) -> int | None:
    assert daemon.proc is not None
    for child in psutil.Process(daemon.proc.pid).children():
        try:
            if str(LIAR) in child.cmdline():
                return child.pid
        except psutil.Error:
            continue
    return None


@pytest.mark.parametrize("restarted", ["daemon", "program"])
def test_a_recovery_that_contradicts_the_store_is_held_and_runs_nothing_twice(
    make_daemon: Callable[..., Daemon], tmp_path: Path, restarted: str
) -> None:
    daemon = make_daemon(lease=2, extra=_extra(tmp_path)).start()
    work_id = daemon.submit("liar-held")
    running = daemon.wait_attempt(work_id, "running", timeout=60).attempts[-1]
    wait_for("the job to start", lambda: daemon.runs(work_id, "start") == 1, timeout=60)
    if restarted == "daemon":
        daemon.signal(signal.SIGKILL)
        daemon.wait_exit()
        daemon.start()
    else:
        pid = _program_pid(daemon)
        assert pid is not None, "the executor program is not running"
        psutil.Process(pid).kill()

    def held() -> object:
        assert daemon.runs(work_id, "start") == 1, "the job ran again"
        attempt = daemon.show(work_id).attempts[-1]
        return attempt.recovery_hold is not None and attempt

    attempt = wait_for("the recovery to be held", held, timeout=60)
    hold = attempt.recovery_hold
    assert hold.code == "recovery_contradicted", hold
    assert "metadata was acknowledged" in hold.message
    assert attempt.id == running.id
    assert attempt.status == "recovering"
    assert not any(s.relaunched for s in attempt.segments)
    detail = daemon.show(work_id)
    assert detail.waiting is not None
    assert detail.waiting.code == "recovery_held"
    assert detail.work.failure_count == 0  # no failure counted, no retry armed
    shown = daemon.cli("work", "show", work_id).stdout
    assert "recovery_contradicted" in shown
    # The job ends on its own; the held Work starts no second attempt, the job ran once.
    daemon.release(work_id)
    wait_for("the job to end", lambda: daemon.runs(work_id, "end") == 1, timeout=60)
    control = daemon.submit("ok")  # the daemon keeps running passes meanwhile
    daemon.wait_status(control, "completed", timeout=60)
    assert [a.attempt for a in daemon.show(work_id).attempts] == [1]
    assert daemon.runs(work_id, "start") == 1


def test_a_held_attempt_is_stopped_and_timed_out_at_its_deadline(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = make_daemon(lease=2, extra=_extra(tmp_path)).start()
    work_id = daemon.submit("liar-held-short")
    daemon.wait_attempt(work_id, "running", timeout=60)
    wait_for("the job to start", lambda: daemon.runs(work_id, "start") == 1, timeout=60)
    daemon.signal(signal.SIGKILL)
    daemon.wait_exit()
    daemon.start()
    wait_for(
        "the recovery to be held",
        lambda: daemon.show(work_id).attempts[0].recovery_hold is not None,
        timeout=60,
    )
    # At its deadline the held attempt is stopped through its executor, the stop verified.
    first = wait_for(
        "attempt 1 to time out",
        lambda: (a := daemon.show(work_id).attempts[0]).status == "timed_out" and a,
        timeout=SHORT_TIMEOUT_S + 60,
    )
    assert first.failure_code == "timeout"
    assert first.exclusion_confirmed
    assert "the stop verified" in (first.failure_message or "")
    # Its retry runs the job again, once; attempt 1's job was really stopped: it never ends.
    wait_for("attempt 2 to start its job", lambda: daemon.runs(work_id, "start") == 2, timeout=60)
    daemon.release(work_id)
    detail = daemon.wait_status(work_id, "completed", timeout=60)
    assert [a.attempt for a in detail.attempts] == [1, 2]
    assert daemon.runs(work_id, "end") == 1
