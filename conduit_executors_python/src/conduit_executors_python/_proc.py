"""Which process a warm worker is: its pid and start time (stdlib only, Linux ``/proc``)."""

from __future__ import annotations

import os
import signal
import time

__all__ = ["end_worker", "process_start"]


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, ``None`` when no such process runs
    (a zombie counts as gone: nothing of it runs)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    if fields[0] == b"Z":
        return None
    return int(fields[19])


def end_worker(worker: object, *, within: float = 10.0) -> str:
    """SIGKILL the warm worker ``{"pid", "started"}`` recovery metadata names, if that very
    process still runs, and wait (up to ``within``) until it is gone. Returns what it found;
    raises ``TimeoutError`` if it outlives the wait."""
    if not isinstance(worker, dict):
        return "no worker recorded"
    pid, started = worker.get("pid"), worker.get("started")
    if not isinstance(pid, int) or not isinstance(started, int) or pid <= 0:
        return "no worker recorded"
    if process_start(pid) != started:
        return f"its warm worker (pid {pid}) is gone"
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return f"its warm worker (pid {pid}) is gone"
    deadline = time.monotonic() + within
    while process_start(pid) == started:
        if time.monotonic() > deadline:
            raise TimeoutError(f"warm worker pid {pid} outlived SIGKILL by {within:g} s")
        time.sleep(0.01)
    return f"its warm worker (pid {pid}), left by an earlier daemon, was killed"
