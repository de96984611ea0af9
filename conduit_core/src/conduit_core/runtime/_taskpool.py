"""Tasks kept for the next call: a cheaper ``start_soon`` for what a host starts per attempt.

Starting an anyio task costs ~55 µs of CPU with anyio 4.14 or later (~23 µs with 4.13: each
task now gets a ``TaskHandle`` with a cancel scope of its own), and a host started one or two
per attempt (the attempt, and the claim its settlement triggers). A ``TaskPool`` keeps the
tasks it started in its task group: a call goes to an idle one, and a task is started only
when none is idle. At 64 attempts at once that is ~7 % more attempts per second on SQLite (see
bench/README, "December, sixth pass").

A call runs as it would in a task of its own in that group: an error it raises ends the group
(cancelling the others, as ``start_soon``'s would), and cancelling the group cancels it. An
idle task waits; ``close`` ends the idle ones (call it before leaving the group's ``async
with``, which otherwise waits for them). Context variables a call sets and does not reset
would be seen by the next call on the same task: the core resets what it sets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

__all__ = ["TaskPool"]

_Call = tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]]


class TaskPool:
    """Runs calls on tasks of ``tg``, reusing idle ones; at most ``max_idle`` are kept idle."""

    def __init__(self, tg: TaskGroup, *, max_idle: int = 256) -> None:
        self._tg = tg
        self._max_idle = max_idle
        self._idle: list[_Idle] = []
        self._closed = False

    def start_soon(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the group, on an idle task if there is one."""
        if self._idle:
            idle = self._idle.pop()
            idle.call = (fn, args)
            idle.wake.set()
        else:
            self._tg.start_soon(self._serve, fn, args)

    def close(self) -> None:
        """End the idle tasks now, and each busy one when its call returns."""
        self._closed = True
        while self._idle:
            self._idle.pop().wake.set()  # woken with no call: it ends

    async def _serve(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        call: _Call | None = (fn, args)
        while call is not None:
            await call[0](*call[1])
            if self._closed or len(self._idle) >= self._max_idle:
                return
            idle = _Idle()
            self._idle.append(idle)
            call = None
            try:
                await idle.wake.wait()
            except BaseException:  # the group is cancelled
                if idle in self._idle:
                    self._idle.remove(idle)
                elif idle.call is not None:
                    # Handed a call as it was cancelled: run it as a task started into a
                    # cancelled group runs (to its first checkpoint, then its cleanup).
                    await idle.call[0](*idle.call[1])
                raise
            call = idle.call


class _Idle:
    """An idle task's wake-up and the call it is given (``None``: end)."""

    __slots__ = ("call", "wake")

    def __init__(self) -> None:
        self.wake = anyio.Event()
        self.call: _Call | None = None
