"""Invariant 12 through a real daemon, on SQLite and PostgreSQL: one misbehaving executor program
never stalls the host loop for anybody else.

Three hostile programs, written here from docs/wire-protocol.md alone, each declared with
``[executors.hostile]`` and run beside shell Work: one never answers ``stop``, one fails its
handshake whenever it is started to serve (it passed the probe at load), one floods
``phase_begin`` callbacks. Shell Work must start within 3 s of its submit, run once (counted by
the jobs' own side effects) and, in the flood, keep its leases; the daemon's memory stays bounded.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from tests.daemon.conftest import Daemon, wait_for

#: How long shell Work may take from its submit to its attempt's start (the issue's bound).
START_WITHIN_MS = 3_000

HOSTILE = r'''
"""A hostile executor program: python hostile.py MODE ROOT."""
import json, os, struct, sys, threading, time

MODE, ROOT = sys.argv[1], sys.argv[2]
out = os.fdopen(os.dup(1), "wb", buffering=0)
inp = sys.stdin.buffer
write_lock = threading.Lock()


def send(message):
    body = json.dumps(message).encode()
    with write_lock:
        out.write(struct.pack(">I", len(body)) + body)


def read():
    header = inp.read(4)
    if len(header) < 4:
        return None
    (length,) = struct.unpack(">I", header)
    return json.loads(inp.read(length))


with open(os.path.join(ROOT, "hostile.starts"), "a") as starts:
    starts.write("start\n")
with open(os.path.join(ROOT, "hostile.starts")) as starts:
    started = len(starts.readlines())
if MODE == "fail_handshake" and started > 1:
    # It passed the probe at load; every later start (to serve) dies before its handshake.
    sys.stderr.write("hostile: refusing to serve\n")
    sys.exit(3)

FLOOD = 100_000
replies = {}
replied = threading.Event()


def flood(rid):
    send({"kind": "persist_recovery", "id": 1, "request": rid, "metadata": {"job": rid}})
    for i in range(2, FLOOD + 1):
        send({"kind": "phase_begin", "id": i, "request": rid, "name": f"step-{i % 7}"})
    replied.wait(120)
    summary = " ".join(f"{k}={v}" for k, v in sorted(replies.items()))
    result = {"outcome": "completed", "summary": summary[:1000]}
    send({"kind": "launched", "id": rid, "handle": "h", "result": result})


launching = {}
MANIFEST = {"name": "hostile", "generation": 1, "capabilities": ["stop"]}
while (msg := read()) is not None:
    kind, rid = msg["kind"], msg["id"]
    if kind == "handshake":
        send({"kind": "handshake_ok", "id": rid, "version": 1, "manifest": MANIFEST})
    elif kind == "run" and MODE == "flood":
        threading.Thread(target=flood, args=(rid,), daemon=True).start()
    elif kind == "run":
        # Recorded before it answers, as the protocol asks: the attempt then counts as running.
        launching[rid] = rid
        send({"kind": "persist_recovery", "id": rid, "request": rid, "metadata": {"job": rid}})
    elif kind == "callback_ok" and rid in launching:
        send({"kind": "launched", "id": launching.pop(rid), "handle": "h-%d" % rid})
    elif kind in ("callback_ok", "callback_refused", "lease_lost"):
        key = kind if kind != "callback_refused" else "refused:" + msg["error"]["code"]
        replies[key] = replies.get(key, 0) + 1
        if sum(replies.values()) >= FLOOD:
            replied.set()
    elif kind == "wait":
        pass  # the job runs until it is stopped
    elif kind == "recover":
        send({"kind": "failed", "id": rid, "error": {"code": "cannot_tell", "message": "?"}})
    elif kind == "stop" and MODE == "hang_stop":
        pass  # never answered
    elif kind == "stop":
        send({"kind": "stopped", "id": rid, "verified": True})
    elif kind in ("cancel", "shutdown"):
        send({"kind": "replied", "id": rid})
        if kind == "shutdown":
            break
'''


def _hostile_daemon(
    make_daemon: Callable[..., Daemon],
    root: Path,
    mode: str,
    *,
    program_extra: str = "",
    **settings: object,
) -> Daemon:
    program = root / "hostile.py"
    program.write_text(HOSTILE)
    extra = f"""
[executors.hostile]
command = ["{sys.executable}", "{program}", "{mode}", "{root}"]
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


class _PeakRss:
    """Samples a process's resident memory in a thread until stopped."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.baseline = self.peak = self.process.memory_info().rss
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.process.memory_info().rss)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak - self.baseline


def test_a_callback_flood_is_refused_past_its_bound_and_stalls_nobody(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = _hostile_daemon(make_daemon, tmp_path, "flood", lease=6, sleep=8)
    assert daemon.proc is not None
    # Long shell jobs whose leases (6 s) must be renewed all through the flood.
    sleepers = [daemon.submit("sleeper") for _ in range(3)]
    for work_id in sleepers:
        wait_for(f"{work_id} to start", lambda w=work_id: daemon.runs(w, "start") == 1)
    memory = _PeakRss(daemon.proc.pid)
    flood = daemon.submit("hostile")
    works = _shell_work_starts_promptly(daemon, rounds=6)
    done = daemon.wait_attempt(flood, "completed", "failed", timeout=120)
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
