"""Out-of-process executors through a real daemon, on SQLite and PostgreSQL: the Python SDK
example (entry point + manifest ``command``) and the Node.js one (``[executors.NAME]``)."""

from __future__ import annotations

import importlib.util
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests._ci import unavailable
from tests.daemon.conftest import Daemon, wait_for

REPO = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")
if NODE is None or importlib.util.find_spec("conduit_example_wire") is None:
    unavailable(
        "needs node (Node.js) on PATH and examples/conduit-example-wire (scripts/setup.sh)",
        allow_module_level=True,
    )


def _extra(root: Path) -> str:
    side = root / "side-effects.log"
    job = f'echo "$CONDUIT_WORK_ID run" >> {side}'
    held = (
        f'echo "$CONDUIT_WORK_ID start" >> {side}; '
        f"while test ! -e {root}/release.$CONDUIT_WORK_ID; do sleep 0.05; done; "
        f'echo "$CONDUIT_WORK_ID end" >> {side}'
    )
    return f"""
[executors.example-node]
command = ["{NODE}", "{REPO / "examples" / "conduit-example-node" / "executor.js"}"]

[bindings.node]
executor = "example-node"
config = {{ command = '{job}' }}

[bindings.node-held]
executor = "example-node"
config = {{ command = '{held}' }}

[bindings.pywire]
executor = "example-wire"
config = {{ command = '{job}' }}

[bindings.pywire-held]
executor = "example-wire"
config = {{ command = '{held}' }}
"""


def _daemon(make_daemon: Callable[..., Daemon], tmp_path: Path, **settings: object) -> Daemon:
    return make_daemon(extra=_extra(tmp_path), **settings).start()


@pytest.mark.parametrize("binding", ["node", "pywire"])
def test_work_runs_once_through_an_executor_program(
    binding: str, make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = _daemon(make_daemon, tmp_path)
    works = [daemon.submit(binding) for _ in range(3)]
    for work_id in works:
        detail = daemon.wait_status(work_id, "completed", timeout=60)
        (attempt,) = detail.attempts
        assert attempt.status == "completed"
        assert daemon.runs(work_id) == 1
    doctor = daemon.cli("doctor", check=False)
    executor = "example-node" if binding == "node" else "example-wire"
    assert f"executor program {executor}: " in doctor.stdout
    assert "answers the handshake" in doctor.stdout


@pytest.mark.parametrize("binding", ["node-held", "pywire-held"])
def test_a_killed_daemon_recovers_through_a_fresh_program(
    binding: str, make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = _daemon(make_daemon, tmp_path, lease=2)
    work_id = daemon.submit(binding)
    daemon.wait_attempt(work_id, "running", timeout=60)
    wait_for(f"{work_id} to start", lambda: daemon.runs(work_id, "start") == 1, timeout=60)
    daemon.signal(signal.SIGKILL)
    daemon.wait_exit()
    daemon.start()

    def adopted() -> bool:
        attempt = daemon.show(work_id).attempts[-1]
        return attempt.epoch >= 2 and attempt.status == "running"

    wait_for(f"{work_id} to be adopted", adopted, timeout=60)
    daemon.release(work_id)
    detail = daemon.wait_status(work_id, "completed", timeout=60)
    (attempt,) = detail.attempts  # adopted by the new daemon's program, never rerun
    assert not attempt.segments[-1].relaunched
    assert daemon.runs(work_id, "start") == 1
    assert daemon.runs(work_id, "end") == 1
