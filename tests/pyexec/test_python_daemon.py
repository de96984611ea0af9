"""A python function through a real daemon: the daemon is SIGKILLed mid-function, restarted, and
the function (adopted, not rerun) has its side effect once."""

from __future__ import annotations

import signal
from collections.abc import Callable

from tests.daemon.conftest import Daemon, job_processes, wait_for
from tests.pyexec._config import REPO

BINDING = """
[bindings.pyfunc]
executor = "python"
config = {{ function = "tests.pyexec.funcs:once", env = {{ PYTHONPATH = "{repo}" }} }}
"""


def test_sigkill_mid_function_then_restart_runs_its_side_effect_once(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(lease=2, extra=BINDING.format(repo=REPO)).start()
    release = daemon.root / "release"
    work_id = daemon.submit("pyfunc", input={"side": str(daemon.side), "release": str(release)})
    execution = daemon.wait_attempt(work_id, "running").attempts[-1].id
    wait_for("the function to start", lambda: daemon.runs(work_id, "start") == 1)
    assert job_processes(execution)

    daemon.signal(signal.SIGKILL)
    daemon.wait_exit()
    assert job_processes(execution)  # the function's interpreter outlives the daemon

    daemon.start()

    def adopted() -> bool:
        attempt = daemon.show(work_id).attempts[-1]
        return attempt.epoch >= 2 and attempt.status == "running"

    wait_for("the function to be recovered", adopted, timeout=45)
    release.touch()
    detail = daemon.wait_status(work_id, "completed", timeout=45)
    (attempt,) = detail.attempts  # adopted, never relaunched
    assert any(s.recovered for s in attempt.segments)
    assert not any(s.relaunched for s in attempt.segments)
    assert daemon.runs(work_id, "start") == 1
    assert daemon.runs(work_id, "end") == 1
    assert job_processes(execution) == []
