"""Warm mode through a real daemon, on both stores: what a crash mid-function does.

The function runs inside the worker, so a crash of the worker (or of the daemon, which takes its
workers with it) leaves nothing to adopt: the attempt is recovered at the next epoch, the
worker answers ``resources_gone``, the attempt fails and its retry policy runs the function again
(at-least-once). These tests show exactly that, with the function's side effects counted.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil

from tests.daemon.conftest import Daemon, wait_for
from tests.pyexec._config import REPO

BINDING = """
[bindings.warm]
executor = "python"
retry_delays_seconds = [0]
config = {{ function = "tests.pyexec.funcs:warm_once", mode = "warm", env = {{ PYTHONPATH = "{repo}" }} }}
"""


def _starts(side: Path, tag: str) -> list[int]:
    if not side.exists():
        return []
    lines = [line.split() for line in side.read_text().splitlines()]
    return [int(parts[2]) for parts in lines if parts[:2] == [tag, "start"]]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _submit(daemon: Daemon, tag: str) -> tuple[str, Path]:
    release = daemon.root / f"release-{tag}"
    payload = {"side": str(daemon.side), "release": str(release), "tag": tag}
    return daemon.submit("warm", input=payload), release


def test_worker_sigkilled_mid_function_fails_the_attempt_and_the_retry_runs_it_again(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(lease=5, extra=BINDING.format(repo=REPO)).start()
    work_id, release = _submit(daemon, "a")
    wait_for("the function to start", lambda: len(_starts(daemon.side, "a")) == 1)
    (worker,) = _starts(daemon.side, "a")

    os.kill(worker, signal.SIGKILL)
    # The retry runs it in a new worker (the supervisor restarted it): a second start.
    wait_for("the retry to start", lambda: len(_starts(daemon.side, "a")) == 2, timeout=45)
    release.touch()
    detail = daemon.wait_status(work_id, "completed", timeout=45)
    first, second = detail.attempts
    assert first.status == "failed"
    assert first.failure_code == "resources_gone", (first.failure_code, first.failure_message)
    assert any(s.recovered for s in first.segments)  # recovered at the next epoch, not rerun
    assert second.status == "completed"
    assert second.result is not None
    assert second.result.data["return"] != worker
    assert daemon.side.read_text().splitlines().count("a end") == 1


def test_daemon_sigkilled_mid_function_takes_its_worker_and_the_restart_retries(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(lease=2, extra=BINDING.format(repo=REPO)).start()
    work_id, release = _submit(daemon, "b")
    wait_for("the function to start", lambda: len(_starts(daemon.side, "b")) == 1)
    (worker,) = _starts(daemon.side, "b")

    daemon.signal(signal.SIGKILL)
    daemon.wait_exit()
    # End-of-file on its stdin: the worker exits with the daemon, its function with it.
    wait_for("the worker to end with its daemon", lambda: _gone(worker), timeout=10)
    assert "b end" not in daemon.side.read_text()

    daemon.start()
    wait_for("the retry to start", lambda: len(_starts(daemon.side, "b")) == 2, timeout=60)
    release.touch()
    detail = daemon.wait_status(work_id, "completed", timeout=45)
    first, second = detail.attempts
    assert first.status == "failed"
    assert first.failure_code == "resources_gone", (first.failure_code, first.failure_message)
    assert second.status == "completed"
    assert daemon.side.read_text().splitlines().count("b end") == 1
