"""Two sweeps of key rows, each a step of the host loop's passes, like the daemon registry's
heartbeat (no timer of its own):

- :class:`KeyRelease` releases dedup and debounce key rows that name nothing any more
  (docs/dedup.md, "Races"): every ``SWEEP_EVERY_MS`` it reads the next ``SWEEP_SCAN`` rows of
  ``conduit_submit_key`` in key order and deletes those whose Work ended (and whose window, if
  any, passed). The cost is one read of at most ``SWEEP_SCAN`` rows of a table that holds only
  the keys of unfinished Work and of open windows.
- :class:`KeyUnpark` unparks the ready Work of concurrency keys with room that a write racing
  the parking left parked (docs/runtime.md, "Concurrency keys"): every ``UNPARK_EVERY_MS`` it
  reads the next ``UNPARK_SCAN`` keys with parked Work (one index probe per key, however many
  Work it has) and counts each one's room afresh. The writes that free a key's place unpark
  its Work themselves; this mends only what they could not see.

A full scan means more may be waiting, so the next pass goes on at once; the end of the table
starts it again from the beginning after the sweep's period.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from conduit_core.runtime import Scheduler

__all__ = [
    "SWEEP_EVERY_MS",
    "SWEEP_SCAN",
    "UNPARK_EVERY_MS",
    "UNPARK_SCAN",
    "KeyRelease",
    "KeyUnpark",
]

#: How often a daemon sweeps the key rows (when the last sweep reached the table's end).
SWEEP_EVERY_MS = 5_000
#: Key rows read per sweep.
SWEEP_SCAN = 2_000
#: How often a daemon looks for parked Work of keys with room (the last sweep done).
UNPARK_EVERY_MS = 1_000
#: Keys with parked Work read per sweep.
UNPARK_SCAN = 100

A = TypeVar("A")


class _CursorSweep(Generic[A]):
    """A sweep's place in its table; :meth:`step` is a ``PassStep``. ``done`` counts the rows
    it changed."""

    def __init__(self, every_ms: int, scan: int) -> None:
        self.every_ms = every_ms
        self.scan = scan
        self.done = 0
        self._after: A | None = None
        self._last_ms: int | None = None

    async def step(self, sched: Scheduler) -> None:
        now = sched.clock.now_ms()
        last = self._last_ms
        if self._after is None and last is not None and now - last < self.every_ms:
            return  # the last sweep reached the table's end lately
        # A store error goes to the pass (``HostLoop._step``: an outage stops the pass and is
        # tracked, anything else is logged); the next pass tries again from the same place.
        done, self._after = await self._sweep(sched, now)
        self._last_ms = now
        self.done += done

    async def _sweep(self, sched: Scheduler, now_ms: int) -> tuple[int, A | None]:
        raise NotImplementedError


class KeyRelease(_CursorSweep[tuple[str, str, str]]):
    """Deletes the dedup and debounce key rows that name nothing any more."""

    def __init__(self, every_ms: int = SWEEP_EVERY_MS, scan: int = SWEEP_SCAN) -> None:
        super().__init__(every_ms, scan)

    async def _sweep(
        self, sched: Scheduler, now_ms: int
    ) -> tuple[int, tuple[str, str, str] | None]:
        return await sched.store.release_submit_keys(
            after=self._after, scan=self.scan, now_ms=now_ms
        )


class KeyUnpark(_CursorSweep[str]):
    """Unparks the parked Work of concurrency keys with room."""

    def __init__(self, every_ms: int = UNPARK_EVERY_MS, scan: int = UNPARK_SCAN) -> None:
        super().__init__(every_ms, scan)

    async def _sweep(self, sched: Scheduler, now_ms: int) -> tuple[int, str | None]:
        return await sched.store.unpark_keys(after=self._after, scan=self.scan)
