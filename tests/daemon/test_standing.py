"""Standing Work idles between inputs (issue 17 item 15), through a real daemon, on both stores.

Before, ``is_claimable`` made ready standing Work claimable with no pending input, so a standing
Work re-ran without pause (attempt 306 within 10 s). The reference: standing Work returns to
ready (idle) after a completed attempt, and ready Work with no pending input is skipped as idle.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .conftest import Daemon, wait_for


def _barrier(daemon: Daemon) -> None:
    """Wait until a Work submitted now has completed: the daemon made claim passes since.

    The negative control: with the old rule, the standing Work re-ran hundreds of times within
    the time a barrier takes, so the attempt counts below would not hold."""
    later = daemon.submit("ok")
    daemon.wait_status(later, "completed")


def test_standing_work_runs_once_per_input_then_idles(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon().start()
    work_id = daemon.submit("ok", kind="standing")  # a submit always carries a first input
    detail = daemon.wait_attempt(work_id, "completed")
    _barrier(daemon)
    _barrier(daemon)
    detail = daemon.show(work_id)
    assert str(detail.work.status) == "ready"  # idle: waiting for its next input
    assert len(detail.attempts) == 1
    assert daemon.runs(work_id) == 1

    status, _ = daemon.raw(
        "POST", f"/v1/work/{work_id}/input", json.dumps({"payload": {"n": 2}}).encode()
    )
    assert status == 202

    def second_attempt_done() -> bool:
        attempts = daemon.show(work_id).attempts
        return len(attempts) >= 2 and str(attempts[-1].status) == "completed"

    wait_for("the second input's attempt", lambda: True if second_attempt_done() else None)
    _barrier(daemon)
    detail = daemon.show(work_id)
    assert len(detail.attempts) == 2
    assert daemon.runs(work_id) == 2
    assert str(detail.work.status) == "ready"
