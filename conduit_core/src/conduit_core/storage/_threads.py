"""The store's worker threads: a blocking store call hops to one, its outcome hops back.

``anyio.to_thread.run_sync`` costs ~110 µs of CPU per call on this kind of machine (a limiter,
a cancel scope, a worker-thread handshake and two futures). Every store call is one such hop
(a write batch, a read), and an attempt makes one or two at concurrency 4. Here an idle thread
is handed the call directly and sets the caller's future through the loop: ~65 µs, and a
PostgreSQL write transaction's client CPU drops by ~90 µs (see bench/README, "December, sixth
pass").

The semantics are anyio's default (not abandoned on cancellation): a cancelled caller still
waits for its call to end, so a write it started is never left running behind its back, and
the cancellation is seen at the caller's next checkpoint. At most ``count`` calls run at once
(the store's connections); the others wait, and run in the order they came.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

__all__ = ["StoreThreads"]

T = TypeVar("T")

_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]


class StoreThreads:
    """At most ``count`` daemon threads, started as calls need them and stopped by ``stop``.

    An idle thread waits on a queue of its own, and the last thread to go idle takes the next
    call (as anyio's own worker threads do): its stack and the connection it used last are
    warm. Waking whichever thread waits longest on one shared queue cost PostgreSQL calls
    ~10 % of their CPU."""

    def __init__(self, count: int, *, name: str) -> None:
        self._count = count
        self._name = name
        self._crew = _Crew()

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` in one of the threads (the event loop must be asyncio's)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        crew = self._crew
        call = (loop, future, fn)
        with crew.lock:
            if crew.idle:
                crew.idle.pop().put(call)
            elif crew.started < self._count:
                crew.started += 1
                own: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
                own.put(call)
                threading.Thread(
                    target=crew.serve, args=(own,), name=f"{self._name}-{crew.started}",
                    daemon=True,
                ).start()
            else:
                crew.backlog.append(call)
        with anyio.CancelScope(shield=True):
            result = await future
        return result

    def stop(self) -> None:
        """Let the threads end once the calls queued so far are done. A later call starts a
        new set (a store used after ``aclose`` gets its backend's own error, as before)."""
        crew, self._crew = self._crew, _Crew()
        with crew.lock:
            crew.stopping = True
            while crew.idle:
                crew.idle.pop().put(None)


class _Crew:
    """One set of threads: those idle (the last to idle at the end), and the calls waiting."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[queue.SimpleQueue[_Call | None]] = []
        self.backlog: deque[_Call] = deque()
        self.started = 0
        self.stopping = False

    def serve(self, own: queue.SimpleQueue[_Call | None]) -> None:
        call = own.get()
        while call is not None:
            loop, future, fn = call
            try:
                outcome: tuple[Any, BaseException | None] = (fn(), None)
            except BaseException as exc:  # the caller's to see, whatever it is
                outcome = (None, exc)
            # Idle before the caller wakes: its next call then finds this thread, warm.
            with self.lock:
                if self.backlog:
                    call = self.backlog.popleft()
                elif self.stopping:
                    call = None
                else:
                    self.idle.append(own)
                    call = _IDLE
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(_settle, future, *outcome)
            del loop, future, fn, outcome  # hold no batch, result or traceback while idle
            if call is _IDLE:
                call = own.get()


#: ``_Crew.serve``'s marker for "wait for the next call on my own queue".
_IDLE: Any = object()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
