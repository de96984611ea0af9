"""A real daemon SIGKILLed inside a shell launch, then restarted: the job runs once, costs nothing.

The daemon kills itself at one launch point through the shell executor's test-only fault switch
(``CONDUIT_TEST_FAULT=<point>:kill``), which hits the window exactly every time. The restarted
daemon (without the switch) recovers the attempt once its lease expires.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon.conftest import Daemon, job_processes, wait_for

_EXTRA = """
[bindings.ident]
executor = "shell"
retry_delays_seconds = []
config = {{ command = 'echo "$CONDUIT_WORK_ID"; while test ! -e {root}/release.$CONDUIT_WORK_ID; do sleep 0.05; done; case "$CONDUIT_WORK_ID" in k:0) exit 3;; k_0) exit 4;; a:b) exit 5;; *) exit 6;; esac' }}
"""


def _unique_work_id() -> str:
    # Tests on both stores run at once on one machine; their jobs' tags must not meet.
    return f"w-{uuid.uuid4().hex[:12]}"


def _killed_at(daemon: Daemon, point: str, binding: str, work_id: str) -> None:
    """Submit with no daemon running, then start one that SIGKILLs itself at ``point``."""
    daemon.cli("work", "submit", binding, "--id", work_id)
    daemon.start(wait=False, env={"CONDUIT_TEST_FAULT": f"{point}:kill"})
    assert daemon.wait_exit(timeout=60) == -signal.SIGKILL, daemon.log()


@pytest.mark.parametrize("binding", ["ok", "held"])
def test_killed_after_spawn_before_the_record_the_job_runs_once(
    make_daemon: Callable[..., Daemon], binding: str
) -> None:
    """Observation 1: the job started, its recovery record was never written."""
    daemon = make_daemon(lease=2)
    word = "run" if binding == "ok" else "start"
    work = _unique_work_id()
    _killed_at(daemon, "shell.after_spawn", binding, work)
    wait_for("the orphaned job to start", lambda: daemon.runs(work, word) == 1)

    daemon.start()
    if binding == "held":  # still running: adopted, then released
        wait_for("adoption", lambda: daemon.show(work).attempts[-1].epoch >= 2)
        daemon.release(work)
    detail = daemon.wait_status(work, "completed", timeout=60)

    assert [a.attempt for a in detail.attempts] == [1], "no second attempt"
    (attempt,) = detail.attempts
    assert attempt.attempt == 1
    assert attempt.status == "completed"
    assert attempt.failure_code is None
    assert detail.work.failure_count == 0
    assert not detail.work.retry_pending
    assert attempt.segments[-1].recovered
    assert not any(segment.relaunched for segment in attempt.segments)
    assert daemon.runs(work, word) == 1, "the job's side effect happened exactly once"
    assert job_processes(attempt.id) == []


@pytest.mark.parametrize("point", ["shell.before_intent", "shell.after_intent"])
def test_killed_before_the_spawn_the_attempt_is_relaunched_at_no_cost(
    make_daemon: Callable[..., Daemon], point: str
) -> None:
    """Observation 2: nothing had started; the kill must not count a failure or spend a retry."""
    daemon = make_daemon(lease=2)
    work = _unique_work_id()
    _killed_at(daemon, point, "ok", work)
    assert daemon.runs(work) == 0

    daemon.start()
    detail = daemon.wait_status(work, "completed", timeout=60)

    assert [a.attempt for a in detail.attempts] == [1], "no second attempt"
    (attempt,) = detail.attempts
    assert attempt.status == "completed"
    assert attempt.failure_code is None
    assert detail.work.failure_count == 0
    assert not detail.work.retry_pending
    assert attempt.segments[-1].relaunched
    assert daemon.runs(work) == 1, "the job ran exactly once"


def test_ids_that_sanitize_alike_keep_their_own_workspace_across_a_restart(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """Issue 17 item 1: `k:0` / `k_0` and `a:b` / `a_b` run at once, across a SIGKILL."""
    daemon = make_daemon(lease=2, extra=_EXTRA.format(root=tmp_path)).start()
    expected = {"k:0": 3, "k_0": 4, "a:b": 5, "a_b": 6}
    for work_id in expected:
        daemon.submit("ident", id=work_id)
    for work_id in expected:
        daemon.wait_attempt(work_id, "running")
        wait_for(f"{work_id}'s job", lambda w=work_id: job_processes(f"{w}#1"))
    daemon.signal(signal.SIGKILL)
    daemon.wait_exit()
    # Two end while no daemon runs (their status waits in their workspaces), two outlive it.
    daemon.release("k:0")
    daemon.release("a_b")

    daemon.start()
    for work_id in ("k_0", "a:b"):
        wait_for("adoption", lambda w=work_id: daemon.show(w).attempts[-1].epoch >= 2)
        daemon.release(work_id)
    for work_id, status in expected.items():
        detail = daemon.wait_attempt(work_id, "failed", timeout=60)
        assert [a.attempt for a in detail.attempts] == [1], work_id
        (attempt,) = detail.attempts
        assert attempt.result is not None
        assert attempt.result.summary == f"exit status {status}", (work_id, daemon.log()[-6000:])
        stdout = next(a.ref for a in attempt.result.artifacts if a.name == "stdout")
        with open(stdout) as out:
            assert out.read() == f"{work_id}\n"
