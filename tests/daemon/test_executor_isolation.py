"""Invariant 12 through a real daemon, on SQLite and PostgreSQL: one misbehaving executor program
never stalls the host loop for anybody else.

Three hostile programs, written here from docs/wire-protocol.md alone, each declared with
``[executors.hostile]`` and run beside shell Work: one never answers ``stop``, one fails its
handshake whenever it is started to serve (it passed the probe at load), one floods
``phase_begin`` callbacks. Shell Work must start within 3 s of its submit, run once (counted by
the jobs' own side effects) and, in the flood, keep its leases; the daemon's memory stays bounded.
"""

from __future__ import annotations

import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.daemon._peak_rss import PeakRss
from tests.daemon.conftest import Daemon, wait_for

#: How long shell Work may take from its submit to its attempt's start (the issue's bound).
START_WITHIN_MS = 3_000

#: The hostile program (``python _hostile_program.py MODE ROOT``); bench/bench_hostile.py runs it
#: too, to measure what the tests bound.
HOSTILE = Path(__file__).with_name("_hostile_program.py")


def _hostile_daemon(
    make_daemon: Callable[..., Daemon],
    root: Path,
    mode: str,
    *,
    program_extra: str = "",
    **settings: object,
) -> Daemon:
    extra = f"""
[executors.hostile]
command = ["{sys.executable}", "{HOSTILE}", "{mode}", "{root}"]
{program_extra}

[bindings.hostile]
executor = "hostile"
retry_delays_seconds = []
"""
    return make_daemon(extra=extra, **settings).start()


def _shell_work_starts_promptly(daemon: Daemon, rounds: int) -> list[str]:
    """Submit shell Work one after another, each once the previous one finished: every one must
    start within ``START_WITHIN_MS`` of its submit and run exactly once."""
    works = []
    for _ in range(rounds):
        work_id = daemon.submit("ok")
        detail = daemon.wait_status(work_id, "completed", timeout=60)
        waited = detail.attempts[0].started_at_ms - detail.work.created_at_ms
        assert waited <= START_WITHIN_MS, f"shell Work {work_id} waited {waited} ms to start"
        works.append(work_id)
    for work_id in works:
        assert daemon.runs(work_id) == 1, f"{work_id} ran {daemon.runs(work_id)} times"
    return works


def _graceful_stop(daemon: Daemon) -> str:
    daemon.signal(signal.SIGTERM)
    assert daemon.wait_exit(30) == 0
    log = daemon.log()
    assert "Future exception was never retrieved" not in log
    assert "Traceback" not in log
    return log


def test_a_stop_that_never_answers_stalls_only_its_own_work(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    # Each stop request times out after 2 s; the proxy restarts the program and asks again, up
    # to five times, before the stop fails.
    daemon = _hostile_daemon(
        make_daemon, tmp_path, "hang_stop", program_extra="request_timeout_seconds = 2"
    )
    hostile = daemon.submit("hostile")
    daemon.wait_attempt(hostile, "running", timeout=60)
    asked = time.monotonic()
    status, body = daemon.raw("POST", f"/v1/work/{hostile}/cancel", b"{}")
    assert status == 200, body
    assert time.monotonic() - asked < 3, "the API's cancel waited on the executor's stop"

    # Several rounds: the unanswered stop is tried again meanwhile, off the pass.
    _shell_work_starts_promptly(daemon, rounds=8)

    def stop_trouble() -> str | None:
        waiting = daemon.show(hostile).waiting
        return waiting.message if waiting and "stop: " in waiting.message else None

    # Visible as this executor's trouble: in the API and in the log.
    under_way = wait_for("the stop under way to show", stop_trouble)
    assert "a try has been under way" in under_way or "failed" in under_way, under_way
    failed = wait_for(
        "the stop's failure to show",
        lambda: (m := stop_trouble()) and "try 1 failed" in m and m,
        timeout=60,
    )
    assert "did not answer within 2 s" in failed, failed
    detail = daemon.show(hostile)
    assert detail.work.status == "cancelled"
    assert detail.waiting is not None
    assert detail.waiting.code == "stop_unconfirmed"
    assert not detail.attempts[-1].exclusion_confirmed  # never verified: its slot stays held
    execution = detail.attempts[-1].id
    assert f"stop execution={execution} epoch=1 executor=hostile failed (try " in daemon.log()
    _graceful_stop(daemon)


def test_a_program_failing_its_handshake_stalls_only_its_own_work(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = _hostile_daemon(make_daemon, tmp_path, "fail_handshake")
    hostile = [daemon.submit("hostile") for _ in range(3)]
    _shell_work_starts_promptly(daemon, rounds=8)
    for work_id in hostile:
        detail = daemon.wait_attempt(work_id, "failed", timeout=60)
        message = detail.attempts[-1].failure_message or ""
        assert "exited with status 3 before answering the handshake" in message, message
    log = _graceful_stop(daemon)
    assert (
        re.search(r"executor program 'hostile' did not start: executor 'hostile' .*exited with status 3", log)
    )


def test_a_callback_flood_is_refused_past_its_bound_and_stalls_nobody(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = _hostile_daemon(make_daemon, tmp_path, "flood", lease=6, sleep=8)
    assert daemon.proc is not None
    # Long shell jobs whose leases (6 s) must be renewed all through the flood.
    sleepers = [daemon.submit("sleeper") for _ in range(3)]
    for work_id in sleepers:
        wait_for(f"{work_id} to start", lambda w=work_id: daemon.runs(w, "start") == 1)
    memory = PeakRss(daemon.proc.pid)
    flood = daemon.submit("hostile")
    works = _shell_work_starts_promptly(daemon, rounds=6)
    # Its 99,000 refusals are read at 2,000 a second (callbacks_refused_per_second): ~50 s.
    done = daemon.wait_attempt(flood, "completed", "failed", timeout=240)
    grew = memory.stop()
    for work_id in sleepers:
        detail = daemon.wait_status(work_id, "completed", timeout=60)
        assert len(detail.attempts) == 1, f"{work_id} lost its lease: {detail.attempts}"
        assert daemon.runs(work_id, "start") == 1
        assert daemon.runs(work_id, "end") == 1
    assert all(daemon.runs(work_id) == 1 for work_id in works)
    # The program counted the core's replies: past the bound, refusals with a stable code.
    result = done.attempts[-1].result
    summary = result.summary if result is not None else ""
    assert "refused:callback_limit_exceeded=" in summary, summary
    assert grew < 64 * 1024 * 1024, f"the daemon's memory grew by {grew >> 20} MiB"
    _graceful_stop(daemon)
