"""Every console action against a real daemon, each beside the refusal that shows it is checked:
release a budget hold, retry blocked Work, interrupt and inject into a running job, and confirm
the stop of a held recovery (the wrong epoch refused first). Pages are read back after each one.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.console.conftest import CONSOLE_EXTRA, Console
from tests.daemon.conftest import Daemon, job_processes, wait_for
from tests.daemon.test_held_recovery import PINNED, attempt, upgrade_shell

BUDGET = """
[[budgets]]
name = "one-attempt"
unit = "attempts"
max = 1
per = "all"
"""


def _console(daemon: Daemon) -> Console:
    console = Console(daemon)
    assert console.login().status_code == 303
    return console


def _needs_card(console: Console, work_id: str) -> str:
    page = console.get("/ui/").text
    found = re.search(rf'<section class="card needs[^"]*"[^>]*data-work="{re.escape(work_id)}">'
                      r".*?</section>", page, re.S)  # fmt: skip
    return found.group(0) if found else ""


def test_release_a_budget_hold(console_daemon: Callable[..., Daemon]) -> None:
    daemon = console_daemon(more=BUDGET)
    console = _console(daemon)
    try:
        first = daemon.submit("ok")
        daemon.wait_status(first, "completed")
        second = daemon.submit("ok")
        card = wait_for("the budget hold in Needs you", lambda: _needs_card(console, second))
        assert "one-attempt" in card
        assert 'action="/ui/work/' in card
        assert "/release" in card
        assert "/approve" not in card  # only the gate's hold is approved
        # Approving a budget hold is refused (only the human gate's hold is approved).
        wrong = console.post(f"/ui/work/{second}/approve")
        assert wrong.status_code == 409
        assert daemon.runs(second) == 0
        assert console.post(f"/ui/work/{second}/release", {"reason": "once"}).status_code == 303
        daemon.wait_status(second, "completed")
        assert daemon.runs(second) == 1
    finally:
        console.close()


def test_retry_blocked_work(console: Console) -> None:
    console.login()
    daemon = console.daemon
    gated = daemon.submit("gated")  # no retry delays: blocked after its first failure
    wait_for("the gated Work to be blocked", lambda: daemon.show(gated).work.blocked_reason)
    page = console.get(f"/ui/work/{gated}").text
    assert 'id="waiting"' in page  # what it waits for, with the CLI's wording
    (daemon.root / "gate").touch()
    assert console.post(f"/ui/work/{gated}/retry", {"reason": "gate opened"}).status_code == 303
    done = daemon.wait_status(gated, "completed")
    assert [a.attempt for a in done.attempts] == [1, 2]
    # Completed Work cannot be retried: the API's 409, nothing runs again.
    again = console.post(f"/ui/work/{gated}/retry")
    assert again.status_code == 409
    assert "not_eligible" in again.text
    assert daemon.runs(gated) == 2


def test_interrupt_and_inject_a_running_job(console: Console) -> None:
    console.login()
    daemon = console.daemon
    work = daemon.submit("forever")
    execution = daemon.wait_attempt(work, "running").attempts[-1].id
    processes = wait_for("the job's processes", lambda: job_processes(execution))

    injected = console.post(f"/ui/work/{work}/inject",
                            {"type": "core.input", "payload": '{"say": "<hi>"}'})  # fmt: skip
    assert injected.status_code == 303
    page = console.get(f"/ui/work/{work}").text
    assert "delivered to the running attempt" in page  # the shell executor takes inject
    assert "&#34;say&#34;: &#34;&lt;hi&gt;&#34;" in page  # the payload, escaped, among the inputs

    assert console.post(f"/ui/work/{work}/interrupt", {"reason": "enough"}).status_code == 303
    _, alive = psutil.wait_procs(processes, timeout=15)
    assert not alive
    wait_for("the interrupted attempt to end",
             lambda: daemon.show(work).attempts[0].exclusion_confirmed)  # fmt: skip
    # (the retry policy may start attempt 2 meanwhile); cancel it, then nothing is left to
    # interrupt: the API's 409 not_running.
    assert console.post(f"/ui/work/{work}/cancel").status_code == 303
    refused = console.post(f"/ui/work/{work}/interrupt")
    assert refused.status_code == 409
    assert "not_running" in refused.text
    # Injecting into ended Work is refused, nothing stored.
    late = console.post(f"/ui/work/{work}/inject", {"payload": "1"})
    assert late.status_code == 409
    assert "not_eligible" in late.text


def test_confirm_the_stop_of_a_held_recovery(
    console_daemon: Callable[..., Daemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    side, root = tmp_path / "side-effects.log", tmp_path
    daemon = console_daemon(more=PINNED.format(pin="generation = 1", side=side, root=root),
                            lease=2)  # fmt: skip
    work = daemon.submit("old")
    wait_for("the job to start", lambda: daemon.runs(work, "start") == 1)
    first = wait_for("attempt 1 to run",
                     lambda: (a := attempt(daemon, work)).status == "running" and a)  # fmt: skip
    jobs = wait_for("the job's processes", lambda: job_processes(first.id))
    daemon.signal(signal.SIGKILL)
    daemon.wait_exit()
    group = os.getpgid(jobs[0].pid)

    upgrade_shell(tmp_path, monkeypatch)
    extra = CONSOLE_EXTRA.format(root=root, side=side)
    daemon.write_config(extra=extra + PINNED.format(pin="", side=side, root=root))
    daemon.start()
    held = wait_for("recovery to be held",
                    lambda: (a := attempt(daemon, work)).recovery_hold is not None and a,
                    timeout=45)  # fmt: skip
    console = _console(daemon)  # a restarted daemon asks for the token again
    try:
        card = wait_for("the held recovery in Needs you", lambda: _needs_card(console, work))
        assert "unsupported_generation" in card
        assert f"Confirm stopped (epoch {held.epoch})" in card
        live = console.get(f"/ui/work/{work}/live").text
        assert "recovery held" in live
        assert "recovery_held" in live

        # The wrong epoch is refused with the API's code; the attempt stays held.
        wrong = console.post(f"/ui/work/{work}/confirm-stopped", {"epoch": str(held.epoch - 1)})
        assert wrong.status_code == 409
        assert "epoch_mismatch" in wrong.text
        assert attempt(daemon, work).status == "recovering"

        # A person makes sure it stopped, then confirms for the held epoch.
        os.killpg(group, signal.SIGKILL)
        wait_for("the job to be gone", lambda: not job_processes(first.id))
        done = console.post(f"/ui/work/{work}/confirm-stopped",
                            {"epoch": str(held.epoch), "reason": "killed it by hand",
                             "next": "/ui/"})  # fmt: skip
        assert done.status_code == 303
        assert done.headers["location"] == "/ui/"
        ended = daemon.show(work).attempts[0]
        assert (ended.status, ended.failure_code) == ("failed", "stop_confirmed")
        assert ended.exclusion_confirmed
        assert "by='console'" in daemon.log()  # the audit names who confirmed
        second = wait_for("attempt 2 to run",
                          lambda: len(d := daemon.show(work).attempts) == 2 and d[1])  # fmt: skip
        assert second.executor_generation == 2
        assert not _needs_card(console, work)
        daemon.release(work)
        daemon.wait_status(work, "completed", timeout=45)
    finally:
        console.close()
