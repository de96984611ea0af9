"""Time is injected: the scheduler reads a :class:`Clock`, never ``time`` directly."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Epoch milliseconds (UTC)."""
        ...


class SystemClock:
    """The trusted wall clock of this host."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock tests move by hand (also backwards, to test that leases never shorten)."""

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        self._now += ms
        return self._now

    def set(self, now_ms: int) -> None:
        self._now = now_ms
