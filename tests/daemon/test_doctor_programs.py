"""``conduit doctor`` and the daemon agree on an executor program's restarts: doctor reads the
running daemon's own counters (``/v1/health``) beside its fresh start of the program. Through a
real daemon whose program dies under a real attempt, on both stores."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.daemon.conftest import Daemon, wait_for

ROGUE = Path(__file__).resolve().parents[1] / "wire" / "_rogue_program.py"
EXTRA = f"""
[executors.rogue]
command = ["{sys.executable}", "{ROGUE}", "exit"]

[bindings.rogue]
executor = "rogue"
"""


def _doctor(daemon: Daemon) -> dict[str, dict[str, Any]]:
    done = daemon.cli("doctor", "--json", check=False)
    return {check["name"]: check for check in json.loads(done.stdout)}


def _rogue(daemon: Daemon) -> dict[str, Any]:
    status, health = daemon.raw("GET", "/v1/health")
    assert status == 200
    (program,) = [p for p in health["programs"] if p["executor"] == "rogue"]
    return program  # type: ignore[no-any-return]


def test_doctor_shows_the_daemons_restarts_of_a_program(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(extra=EXTRA).start()
    before = _rogue(daemon)
    assert (before["executor"], before["restarts"], before["status"]) == ("rogue", 0, "not started")
    checks = _doctor(daemon)
    assert checks["executor program rogue in the daemon"]["status"] == "ok"
    assert "0 restart(s)" in checks["executor program rogue in the daemon"]["message"]

    # The program exits when asked to run: the daemon restarts it and sends the attempt to
    # recover, which this program cannot answer (the attempt is held).
    work_id = daemon.submit("rogue")
    wait_for("the daemon to restart the program", lambda: _rogue(daemon)["restarts"] >= 1)
    wait_for(f"{work_id}'s attempt to end", lambda: daemon.show(work_id).attempts
             and str(daemon.show(work_id).attempts[-1].status) != "launching")  # fmt: skip
    after = _rogue(daemon)
    assert "executor 'rogue' exited" in after["last_error"]

    def logged() -> int:
        return len(re.findall(r"executor 'rogue' exited[^\n]*; restarting it", daemon.log()))

    # The attempt may be retried meanwhile (and the program die again): doctor's count lies
    # between the daemon log's count before and after it.
    logged_before = logged()
    checks = _doctor(daemon)
    logged_after = logged()
    in_daemon = checks["executor program rogue in the daemon"]
    assert in_daemon["status"] == "warn"
    found = re.search(r"; (\d+) restart\(s\)", in_daemon["message"])
    assert found is not None, in_daemon
    assert 1 <= logged_before <= int(found[1]) <= logged_after
    assert "executor 'rogue' exited" in in_daemon["message"]
    fresh = checks["executor program rogue"]
    assert fresh["status"] == "ok"
    assert "a fresh start by doctor" in fresh["message"]
