"""Releasing dedup and debounce key rows that name nothing any more (docs/dedup.md, "Races").

A step of the host loop's passes, like the daemon registry's heartbeat (no timer of its own):
every ``SWEEP_EVERY_MS`` it reads the next ``SWEEP_SCAN`` rows of ``conduit_submit_key`` in key
order and deletes those whose Work ended (and whose window, if any, passed). A full scan means
more may be waiting, so the next pass goes on at once; the end of the table starts it again
from the beginning after ``SWEEP_EVERY_MS``. The cost is one read of at most ``SWEEP_SCAN``
rows of a table that holds only the keys of unfinished Work and of open windows.
"""

from __future__ import annotations

from conduit_core.runtime import Scheduler

__all__ = ["SWEEP_EVERY_MS", "SWEEP_SCAN", "KeyRelease"]

#: How often a daemon sweeps the key rows (when the last sweep reached the table's end).
SWEEP_EVERY_MS = 5_000
#: Key rows read per sweep.
SWEEP_SCAN = 2_000


class KeyRelease:
    """The sweep's place in the key table; :meth:`step` is a ``PassStep``."""

    def __init__(self, every_ms: int = SWEEP_EVERY_MS, scan: int = SWEEP_SCAN) -> None:
        self.every_ms = every_ms
        self.scan = scan
        self.released = 0
        self._after: tuple[str, str, str] | None = None
        self._last_ms: int | None = None

    async def step(self, sched: Scheduler) -> None:
        now = sched.clock.now_ms()
        last = self._last_ms
        if self._after is None and last is not None and now - last < self.every_ms:
            return  # the last sweep reached the table's end lately
        # A store error goes to the pass (``HostLoop._step``: an outage stops the pass and is
        # tracked, anything else is logged); the next pass tries again from the same place.
        released, self._after = await sched.store.release_submit_keys(
            after=self._after, scan=self.scan, now_ms=now
        )
        self._last_ms = now
        self.released += released
