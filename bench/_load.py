"""What bench_daemon.py shares with its Procrastinate side (stdlib only: both venvs import it).

- :class:`Histogram`: insert → start latencies in log-spaced buckets (2 % wide), so memory is
  bounded by the range of values, never by the number of jobs.
- :class:`StartLog`: follows the file every job appends ``<id> <t0> <start>`` to when it starts.
- :class:`Producer`: submits at a fixed offered rate, credited on wall-clock time (a late tick
  submits what fell due meanwhile), in batches every ``tick_s``; in ``backlog`` mode it keeps
  the queue near a depth instead. Ids are its own (``j000000001``…), so a batch whose answer was
  lost is resent with the same ids and the store answers ``work_exists`` for what it had.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

__all__ = ["Histogram", "Producer", "StartLog", "append_line"]

_GROWTH = math.log(1.02)


class Histogram:
    """Milliseconds in buckets 2 % wide (values under 0.1 ms share one)."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.total = 0

    def add(self, ms: float) -> None:
        key = -1 if ms < 0.1 else int(math.log(ms / 0.1) / _GROWTH)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.total += 1

    def merge(self, other: Histogram) -> None:
        for key, n in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        self.total += other.total

    def percentile(self, p: float) -> float | None:
        if not self.total:
            return None
        rank = math.ceil(self.total * p / 100)
        seen = 0
        for key in sorted(self.counts):
            seen += self.counts[key]
            if seen >= rank:
                return 0.1 if key < 0 else 0.1 * math.exp((key + 1) * _GROWTH)
        raise AssertionError("unreachable")


class StartLog:
    """Reads the lines jobs appended since the last read; counts starts per id."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.starts: dict[str, int] = {}

    def read(self) -> list[tuple[str, float]]:
        """``(id, insert → start ms)`` of every start appended since the last call."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out: list[tuple[str, float]] = []
        for line in lines:
            job_id, t0, started = line.decode().split()
            self.starts[job_id] = self.starts.get(job_id, 0) + 1
            if t0 != "None":
                out.append((job_id, (float(started) - float(t0)) * 1000))
        return out

    def twice(self) -> int:
        return sum(1 for n in self.starts.values() if n > 1)


class Producer:
    """Calls ``submit([(id, t0), …])`` every ``tick_s`` with what fell due; ``submit`` returns
    when the batch is stored and raises when it was not (the same ids go again next tick)."""

    def __init__(
        self,
        submit: Callable[[list[tuple[str, float]]], None],
        *,
        rate: float,
        tick_s: float = 0.025,
        max_batch: int = 1000,
        backlog: int | None = None,
        started: Callable[[], int] | None = None,
    ) -> None:
        self.submit = submit
        self.rate = rate
        self.tick_s = tick_s
        self.max_batch = max_batch
        self.backlog = backlog
        self.started = started
        self.submitted = 0  # stored (acknowledged)
        self.offered = 0  # fell due (what the rate asked for)
        self.failures = 0
        self.stop = threading.Event()
        self._pending: list[tuple[str, float]] = []
        self._next_id = 0

    def _new(self, n: int) -> None:
        now = time.time()
        for _ in range(n):
            self._next_id += 1
            self._pending.append((f"j{self._next_id:09d}", now))

    def run(self, seconds: float) -> None:
        start = time.monotonic()
        next_tick = start
        while not self.stop.is_set():
            now = time.monotonic()
            if now - start >= seconds:
                break
            if self.backlog is not None:
                assert self.started is not None
                want = self.backlog - (self.submitted + len(self._pending) - self.started())
                due = max(0, want)
            else:
                due = int(self.rate * (now - start)) - self.offered
            self.offered += due
            self._new(due)
            if self._pending:
                batch = self._pending[: self.max_batch]
                try:
                    self.submit(batch)
                except Exception:
                    self.failures += 1
                else:
                    del self._pending[: len(batch)]
                    self.submitted += len(batch)
            next_tick += self.tick_s
            delay = next_tick - time.monotonic()
            if delay > 0:
                self.stop.wait(delay)
            else:
                next_tick = time.monotonic()

    def flush(self, timeout_s: float) -> None:
        """Store what is still pending (a batch refused at the end of the run), until stored or
        ``timeout_s``, so every id offered is accounted for."""
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            batch = self._pending[: self.max_batch]
            try:
                self.submit(batch)
            except Exception:
                self.failures += 1
                time.sleep(0.2)
            else:
                del self._pending[: len(batch)]
                self.submitted += len(batch)


def append_line(path: str, line: str) -> None:
    """One whole line appended (the start log of a job, from any process)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
