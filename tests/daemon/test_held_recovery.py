"""Issue 13, observation 3, through a real daemon and a real shell job on both stores.

A running shell attempt is pinned to executor generation 1; the daemon is SIGKILLed; it restarts
with an upgraded shell package that no longer declares generation 1 (a real installed
distribution on PYTHONPATH, the original blocked with CONDUIT_DISABLED_PLUGINS). Recovery fails
closed: the attempt is held, its Work starts no attempt 2 while attempt 1's process still runs,
and needs-you, ``work show`` and the API say how to settle it. Then either the generation comes
back (recovery adopts the job by itself) or a person confirms the stop for the right epoch
(attempt 2 may start); the wrong epoch is refused.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.core._fake_dist import write_plugin_dist

from .conftest import Daemon, job_processes, wait_for

PINNED = """
[bindings.old]
executor = "shell"
{pin}
retry_delays_seconds = [0.2]
config = {{ command = 'echo "$CONDUIT_WORK_ID start" >> {side}; while test ! -e {root}/release.$CONDUIT_WORK_ID; do sleep 0.05; done; echo "$CONDUIT_WORK_ID end" >> {side}' }}
"""

#: The "upgraded" shell package: the same executor, generation 2 only (1 is no longer declared).
UPGRADED_SOURCE = """
from conduit_core.extension import ExecutorRegistration, hookimpl
from conduit_executors_shell._executor import ShellExecutor

@hookimpl
def conduit_executors():
    return [ExecutorRegistration(name="shell", generation=2, executor=ShellExecutor(2))]
"""
UPGRADED_MANIFEST = """schema = 1
package = "conduit-executors-shell-next"

[[executors]]
name = "shell"
pool = "jobs"
generation = 2
historical_generations = []
capabilities = ["inject", "interrupt", "stop"]
"""


def binding(daemon: Daemon, *, pinned: bool) -> str:
    return PINNED.format(pin="generation = 1" if pinned else "", side=daemon.side, root=daemon.root)


def upgrade_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Install the upgraded package for the next daemon start (its environment is inherited)."""
    root = write_plugin_dist(
        tmp_path / "upgraded",
        dist="conduit-executors-shell-next",
        module="shell_next",
        source=UPGRADED_SOURCE,
        manifest=UPGRADED_MANIFEST,
        entry_name="shell-next",
    )
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("CONDUIT_DISABLED_PLUGINS", "shell")


def attempt(daemon: Daemon, work_id: str) -> Any:
    return daemon.show(work_id).attempts[-1]


def needs_you(daemon: Daemon) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = msgspec.json.decode(daemon.cli("needs-you", "--json").stdout)[
        "items"
    ]
    return items


@pytest.mark.parametrize("settle", ["reinstall", "confirm"])
def test_a_held_recovery_blocks_a_second_run_until_settled(
    make_daemon: Callable[..., Daemon],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settle: str,
) -> None:
    monkeypatch.setenv("COLUMNS", "500")  # ``work show`` lines unwrapped
    daemon = make_daemon(lease=2)
    daemon.write_config(extra=binding(daemon, pinned=True))
    daemon.start()
    work_id = daemon.submit("old")
    wait_for("the job to start", lambda: daemon.runs(work_id, "start") == 1)
    first = wait_for(
        "attempt 1 to run", lambda: (a := attempt(daemon, work_id)).status == "running" and a
    )
    assert first.executor_generation == 1
    daemon.signal(signal.SIGKILL)
    daemon.wait_exit()
    jobs = job_processes(first.id)  # the detached job outlives the daemon
    assert jobs
    group = os.getpgid(jobs[0].pid)

    # Restart after an upgrade that dropped generation 1 (the binding no longer pins it).
    with monkeypatch.context() as upgraded:
        upgrade_shell(tmp_path, upgraded)
        daemon.write_config(extra=binding(daemon, pinned=False))
        daemon.start()
        held = wait_for(
            "recovery to be held",
            lambda: (a := attempt(daemon, work_id)).recovery_hold is not None and a,
            timeout=45,
        )
        hold = held.recovery_hold
        assert held.status == "recovering"
        assert hold.code == "unsupported_generation"
        assert "reinstall a package that declares executor 'shell' generation 1" in hold.settle
        assert f"conduit work confirm-stopped {work_id} --epoch {held.epoch}" in hold.settle
        detail = daemon.show(work_id)
        assert detail.waiting is not None
        assert detail.waiting.code == "recovery_held"
        assert str(detail.work.status) == "running"
        assert detail.work.failure_count == 0  # no failure counted, no retry armed
        assert not detail.work.retry_pending
        (item,) = [i for i in needs_you(daemon) if i["work_id"] == work_id]
        assert (item["kind"], item["epoch"], item["execution_id"]) == (
            "recovery", held.epoch, held.id,
        )  # fmt: skip
        shown = daemon.cli("work", "show", work_id).stdout
        assert "recovery held" in shown
        assert f"--epoch {held.epoch}" in shown
        # The daemon keeps running passes: a control job completes meanwhile ...
        control = daemon.submit("ok")
        daemon.wait_status(control, "completed")
        # ... but the held Work started no second attempt while attempt 1 still runs.
        assert [a.attempt for a in daemon.show(work_id).attempts] == [1]
        assert job_processes(first.id)
        assert daemon.runs(work_id, "start") == 1
        # Negative control: a confirmation for another epoch is refused, nothing changes.
        wrong = daemon.cli(
            "work", "confirm-stopped", work_id, "--epoch", str(held.epoch - 1), check=False
        )
        assert wrong.returncode != 0
        assert "epoch_mismatch" in wrong.stderr
        status, body = daemon.raw(
            "POST", f"/v1/work/{work_id}/confirm-stopped", b'{"epoch": 1, "by": "me"}'
        )
        assert (status, body["code"]) == (409, "epoch_mismatch")
        assert attempt(daemon, work_id).status == "recovering"

        if settle == "confirm":
            # A person makes sure it stopped, then says so for the held epoch.
            os.killpg(group, signal.SIGKILL)
            wait_for("the job to be gone", lambda: not job_processes(first.id))
            # With the daemon stopped, the CLI confirms on the store directly.
            daemon.signal(signal.SIGTERM)
            daemon.wait_exit()
            daemon.cli(
                "work", "confirm-stopped", work_id, "--epoch", str(held.epoch),
                "--reason", "killed it by hand",
            )  # fmt: skip
            daemon.start()
            ended = daemon.show(work_id).attempts[0]
            assert (ended.status, ended.failure_code) == ("failed", "stop_confirmed")
            assert ended.exclusion_confirmed
            second = wait_for(
                "attempt 2 to run",
                lambda: (
                    len(d := daemon.show(work_id).attempts) == 2
                    and str(d[1].status) == "running"
                    and d[1]
                ),
            )
            assert second.executor_generation == 2
            daemon.release(work_id)
            done = daemon.wait_status(work_id, "completed", timeout=45)
            assert [a.attempt for a in done.attempts] == [1, 2]
            assert daemon.runs(work_id, "start") == 2
            assert daemon.runs(work_id, "end") == 1  # attempt 1 never finished: killed
            return
        daemon.signal(signal.SIGTERM)
        daemon.wait_exit()

    # The pinned generation is back (the upgrade undone): recovery adopts it by itself.
    daemon.write_config(extra=binding(daemon, pinned=True))
    daemon.start()
    wait_for(
        "the held recovery to adopt",
        lambda: (a := attempt(daemon, work_id)).recovery_hold is None and a.status == "running",
        timeout=45,
    )
    daemon.release(work_id)
    done = daemon.wait_status(work_id, "completed", timeout=45)
    (only,) = done.attempts
    assert only.epoch == held.epoch
    assert daemon.runs(work_id, "start") == 1
    assert daemon.runs(work_id, "end") == 1
    wait_for("the adopted job to end", lambda: not job_processes(first.id))
