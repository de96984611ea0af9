"""Work through a real daemon, on SQLite and PostgreSQL: submit, watch, retry, cancel, interrupt."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

import psutil

from tests.daemon.conftest import Daemon, job_processes, wait_for


def test_submit_over_http_and_cli_then_watch_to_completion(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon().start()
    via_http = daemon.submit("ok", input={"n": 1})
    submitted = json.loads(
        daemon.cli("work", "submit", "ok", "--input", '{"n": 2}', "--json").stdout
    )
    via_cli = submitted["work"]["id"]
    assert submitted["work"]["binding"] == "ok"

    for work_id in (via_http, via_cli):
        watched = daemon.cli("work", "watch", work_id, "--json", "--timeout", "30")
        detail = json.loads(watched.stdout)
        assert detail["work"]["status"] == "completed"
        (attempt,) = detail["attempts"]
        assert attempt["status"] == "completed"
        assert attempt["result"]["data"]["exit_status"] == 0
        # The attempt's segment shows its launch, phase by phase.
        (segment,) = attempt["segments"]
        assert [p["name"] for p in segment["launch"]][:2] == ["environment", "executor"]
        assert daemon.runs(work_id) == 1

    listed = json.loads(daemon.cli("work", "list", "--json").stdout)
    assert {w["id"] for w in listed["items"]} == {via_http, via_cli}
    table = daemon.cli("work", "list").stdout
    assert via_http in table
    assert "completed" in table


def test_failure_is_retried_by_policy_and_by_hand(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    flaky = daemon.submit("flaky")
    detail = daemon.wait_status(flaky, "completed")
    assert [str(a.status) for a in detail.attempts] == ["failed", "completed"]
    assert detail.attempts[0].failure_code == "failed"
    assert daemon.runs(flaky) == 2

    gated = daemon.submit("gated")  # no retry delays: blocked after its first failure
    blocked = wait_for(
        "the gated Work to be blocked",
        lambda: (d := daemon.show(gated)).work.blocked_reason and d,
    )
    assert blocked.work.status == "ready"
    assert blocked.work.last_attempt == 1
    assert daemon.cli("work", "watch", gated, check=False).returncode == 1  # blocked: not completed
    (daemon.root / "gate").touch()
    daemon.cli("work", "retry", gated, "--reason", "gate opened")
    done = daemon.wait_status(gated, "completed")
    assert [a.attempt for a in done.attempts] == [1, 2]
    assert daemon.runs(gated) == 2


def test_cancel_stops_the_running_job(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    work_id = daemon.submit("forever")
    detail = daemon.wait_attempt(work_id, "running")
    execution_id = detail.attempts[-1].id
    processes = wait_for("the job's processes", lambda: job_processes(execution_id))
    assert processes

    cancelled = daemon.cli("work", "cancel", work_id, "--json")
    assert json.loads(cancelled.stdout)["work"]["status"] == "cancelled"
    _, alive = psutil.wait_procs(processes, timeout=15)
    assert not alive, "the cancelled job's processes still run"
    assert not job_processes(execution_id)
    final = wait_for(
        "the stop to be confirmed",
        lambda: (d := daemon.show(work_id)).attempts[-1].exclusion_confirmed and d,
    )
    assert final.attempts[-1].status == "cancelled"
    # Cancelling again is a conflict; nothing runs twice.
    status, body = daemon.raw("POST", f"/v1/work/{work_id}/cancel", b"{}")
    assert (status, body["code"]) == (409, "not_eligible")
    assert daemon.runs(work_id, "start") == 1


def test_interrupt_stops_the_running_attempt(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    work_id = daemon.submit("forever")
    execution_id = daemon.wait_attempt(work_id, "running").attempts[-1].id
    processes = wait_for("the job's processes", lambda: job_processes(execution_id))

    daemon.cli("work", "interrupt", work_id)
    _, alive = psutil.wait_procs(processes, timeout=15)
    assert not alive
    final = wait_for(
        "the interrupted attempt to end, its stop confirmed",
        lambda: (d := daemon.show(work_id)).attempts[-1].exclusion_confirmed and d,
    )
    assert final.attempts[-1].status != "running"
    assert final.work.status != "running"
    # Nothing left to interrupt.
    status, _ = daemon.raw("POST", f"/v1/work/{work_id}/interrupt", b"{}")
    assert status == 409


def test_capacity_reports_pools_and_sigterm_exits_zero(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    work_id = daemon.submit("forever")
    daemon.wait_attempt(work_id, "running")
    capacity = json.loads(daemon.cli("capacity", "--json").stdout)
    pools = {p["name"]: p for p in capacity["pools"]}
    assert pools["jobs"]["limit"] == 4
    assert pools["jobs"]["in_use"] == 1
    assert pools["global"]["in_use"] == 0
    daemon.signal(signal.SIGTERM)
    assert daemon.wait_exit() == 0
    assert not (daemon.data / "daemon.pid").exists()


def test_a_retry_timer_wakes_the_daemon_before_its_rescan(
    make_daemon: Callable[..., Daemon],
) -> None:
    # The rescan is 30 s and the retry delay 0.2 s: the retry runs because the loop sleeps only
    # until the next timer is due, not because a rescan came round.
    daemon = make_daemon().start(rescan=30)
    flaky = daemon.submit("flaky")
    detail = daemon.wait_status(flaky, "completed", timeout=10)
    assert [str(a.status) for a in detail.attempts] == ["failed", "completed"]
