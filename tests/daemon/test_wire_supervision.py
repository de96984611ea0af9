"""An executor program's supervision through a real daemon, on SQLite and PostgreSQL.

The program is ``tests/wire/_probe_program.py``, a wire program on the standard library alone,
told by each binding's config how to behave (see its docstring). Jobs append ``<work> run`` to
the side-effect file, so a test counts how many times each one ran from the jobs themselves.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.daemon.conftest import Daemon, wait_for

PROGRAM = Path(__file__).resolve().parents[1] / "wire" / "_probe_program.py"


def _extra(root: Path) -> str:
    def binding(name: str, config: str, more: str = "") -> str:
        return f"""
[bindings.probe-{name}]
executor = "probe"
{more}
config = {{ root = "{root}"{config} }}
"""

    return f"""
[executors.probe]
command = ["{sys.executable}", "{PROGRAM}"]
request_timeout_seconds = 20
restart_backoff_max_seconds = 0.2

[pools.probe]
concurrency = 3
""" + "".join(
        [
            binding("quick", ""),
            binding(
                "crashes-child-holds-stdout",
                ", hold = true, grandchild = true, crash_in_wait = true",
                "timeout_seconds = 120",
            ),
            binding("malformed-launched", ', launched = "malformed"'),
            binding(
                "crashes-in-wait-cannot-tell",
                ', hold = true, crash_in_wait = true, recover = "cannot_tell"',
            ),
            binding(
                "crashes-in-run-cannot-tell",
                ', hold = true, crash_in_run = true, recover = "cannot_tell"',
            ),
            binding("gated", ", gate = true"),
            binding("fails-after-start", ', after_start = "fail"', "retry_delays_seconds = []"),
        ]
    )


def _daemon(make_daemon: Callable[..., Daemon], tmp_path: Path) -> Daemon:
    return make_daemon(extra=_extra(tmp_path)).start()


def _program(daemon: Daemon) -> psutil.Process | None:
    """The daemon's live probe program, if it runs."""
    assert daemon.proc is not None
    for child in psutil.Process(daemon.proc.pid).children():
        try:
            if str(PROGRAM) in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def test_a_program_exit_is_seen_though_its_child_keeps_stdout_open(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    # The program forks a setsid child that holds its stdout, then dies during the wait: the
    # daemon watches the process, not the pipe, and sends the attempt through recover at once.
    daemon = _daemon(make_daemon, tmp_path)
    work_id = daemon.submit("probe-crashes-child-holds-stdout")
    wait_for(f"{work_id} to run", lambda: daemon.runs(work_id) == 1, timeout=60)
    wait_for("the program's exit to be seen", lambda: "exited with status 7" in daemon.log())
    daemon.release(work_id)
    # Followed through the restarted program's recover at once: its 120 s deadline is far.
    detail = daemon.wait_status(work_id, "completed", timeout=20)
    (attempt,) = detail.attempts  # adopted, never timed out nor run again
    assert attempt.status == "completed"
    assert daemon.runs(work_id) == 1
    # The recovery after the program's restart has an epoch of its own, and says so.
    assert [(s.epoch, s.recovered, s.relaunched) for s in attempt.segments] == [
        (1, False, False),
        (2, True, False),
    ]
    shown = daemon.cli("work", "show", work_id).stdout
    assert "recovered" in shown, shown


def test_a_malformed_launched_after_persist_recovery_is_recovered_not_rerun(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = _daemon(make_daemon, tmp_path)
    work_id = daemon.submit("probe-malformed-launched")
    detail = daemon.wait_attempt(work_id, "completed", "failed", timeout=60)
    (attempt,) = detail.attempts
    assert attempt.status == "completed", attempt.failure_message
    assert daemon.runs(work_id) == 1
    assert "wire_invalid_message" in daemon.log()  # counted as a protocol error, said in the log
    assert attempt.failure_code is None


@pytest.mark.parametrize("where", ["in-wait", "in-run"])
def test_cannot_tell_after_a_program_restart_holds_the_attempt(
    where: str, make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    # The program dies under the attempt (observing it, or launching it after its metadata);
    # the restarted program's recover cannot tell: held, as after a daemon restart.
    daemon = _daemon(make_daemon, tmp_path)
    work_id = daemon.submit(f"probe-crashes-{where}-cannot-tell")
    wait_for(f"{work_id} to run", lambda: daemon.runs(work_id) == 1, timeout=60)

    def held() -> bool:
        attempt = daemon.show(work_id).attempts[-1]
        return attempt.recovery_hold is not None

    wait_for(f"{work_id}'s attempt to be held", held, timeout=30)
    detail = daemon.show(work_id)
    (attempt,) = detail.attempts  # held: never failed into a retry that runs the job again
    assert attempt.recovery_hold is not None
    assert attempt.recovery_hold.code == "cannot_tell"
    assert attempt.status == "recovering"
    assert daemon.runs(work_id) == 1


def test_a_stale_callback_after_a_cancel_is_answered_lease_lost(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = _daemon(make_daemon, tmp_path)
    work_id = daemon.submit("probe-gated")
    wait_for(f"{work_id}'s launch intent", lambda: daemon.runs(work_id, "intent") == 1, timeout=60)
    status, _ = daemon.raw("POST", f"/v1/work/{work_id}/cancel", b"{}")
    assert status == 200
    daemon.wait_status(work_id, "cancelled")
    (tmp_path / f"gate.{work_id}").touch()  # the launch goes on and reports, too late
    answers = tmp_path / "answers.log"
    wait_for("the program's persist_recovery to be answered", answers.exists, timeout=30)
    assert answers.read_text().split() == [work_id, "lease_lost"]


def test_capacity_shows_the_limit_of_a_pool_a_program_uses(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = _daemon(make_daemon, tmp_path)
    status, body = daemon.raw("GET", "/v1/capacity")
    assert status == 200
    pools = {pool["name"]: pool for pool in body["pools"]}
    assert pools["probe"]["limit"] == 3


def test_a_stop_without_recovery_metadata_finds_the_launch_by_its_intent_and_state_dir(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    # The run fails after starting its job but before persisting recovery metadata: the stop
    # that confirms the attempt's exclusion has only the launch intent (a marker) and the
    # executor's state dir to find exactly that job.
    daemon = _daemon(make_daemon, tmp_path)
    work_id = daemon.submit("probe-fails-after-start")
    wait_for(f"{work_id} to run", lambda: daemon.runs(work_id) == 1, timeout=60)
    detail = daemon.wait_attempt(work_id, "failed", timeout=30)
    assert detail.attempts[-1].failure_code == "launch_broke"

    def confirmed() -> bool:
        return daemon.show(work_id).attempts[-1].exclusion_confirmed

    wait_for(f"{work_id}'s stop to be verified", confirmed, timeout=30)
    (pid_file,) = (daemon.data / "probe").glob("*/pid")
    with pytest.raises(ProcessLookupError):
        os.killpg(int(pid_file.read_text()), 0)


def test_an_idle_program_killed_20_times_is_reported_killed_each_time(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    # The supervisor alone reaps its program: no other waiter (asyncio's child watcher, the
    # shell executor reaping its jobs meanwhile) takes the status, so every kill reads SIGKILL.
    daemon = _daemon(make_daemon, tmp_path)
    for round_ in range(20):
        work_id = daemon.submit("probe-quick")
        shell = daemon.submit("ok")
        daemon.wait_status(work_id, "completed", timeout=60)
        program = wait_for(f"round {round_}: the program", lambda: _program(daemon))
        program.send_signal(signal.SIGKILL)
        said = f"was killed by signal SIGKILL (pid {program.pid})"
        wait_for(f"round {round_}: the kill to be reported", lambda: said in daemon.log())  # noqa: B023
        daemon.wait_status(shell, "completed", timeout=60)
    # And at a graceful stop: the program is asked to exit and reaped by the supervisor.
    daemon.wait_status(daemon.submit("probe-quick"), "completed", timeout=60)
    last = wait_for("the program", lambda: _program(daemon))
    daemon.signal(signal.SIGTERM)
    assert daemon.wait_exit() == 0
    assert not psutil.pid_exists(last.pid) or last.status() == psutil.STATUS_ZOMBIE
    log = daemon.log()
    assert log.count("WARNING conduit.remote: executor 'probe' was killed by signal SIGKILL") == 20
    assert "Unknown child process" not in log  # main: 6 in 12 kills
    assert "returncode 255" not in log
