"""Generated Work ids: time-ordered, and never the same twice, even at bulk rates.

``w-<ms, 12 hex>-<sequence, 4 hex><process, 10 hex>``. Within one process a sequence number
makes every id of one millisecond distinct (and keeps them in creation order, since ``work
list`` pages by id); a clock that steps back keeps counting from the last id instead of going
back. Between processes the 40 random bits drawn once per process (and again in a forked
child) tell them apart: two processes collide only if they draw the same 40 bits, where the
former 24 random bits per id collided within a few thousand ids of one millisecond.
"""

from __future__ import annotations

import os
import secrets
import threading

__all__ = ["WorkIds", "new_work_id"]

_SEQUENCE_SPAN = 1 << 16


class WorkIds:
    """One process's id source (thread-safe)."""

    def __init__(self) -> None:
        self._reseed()

    def _reseed(self) -> None:
        # A fresh lock too: another thread may have held the parent's at the fork.
        self._lock = threading.Lock()
        self._process = secrets.token_hex(5)
        self._last_ms = -1
        self._sequence = 0

    def next_id(self, now_ms: int) -> str:
        with self._lock:
            if now_ms > self._last_ms:
                self._last_ms, self._sequence = now_ms, 0
            else:
                self._sequence += 1
                if self._sequence == _SEQUENCE_SPAN:
                    # 65,536 ids in one millisecond: borrow the next one, order is kept.
                    self._last_ms, self._sequence = self._last_ms + 1, 0
            ms, sequence = self._last_ms, self._sequence
        return f"w-{ms:012x}-{sequence:04x}{self._process}"


_IDS = WorkIds()
# A forked child must not repeat its parent's ids.
os.register_at_fork(after_in_child=_IDS._reseed)


def new_work_id(now_ms: int) -> str:
    """A fresh Work id; ids sort by creation time (``work list`` pages by id)."""
    return _IDS.next_id(now_ms)
