"""A process's peak resident memory, sampled in a thread (the hostile-program tests and
bench/bench_hostile.py)."""

from __future__ import annotations

import contextlib
import threading

import psutil


class PeakRss:
    """Samples a process's resident memory every 50 ms until stopped."""

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
        """How many bytes the peak rose above the first sample."""
        self._done.set()
        self._thread.join()
        return self.peak - self.baseline
