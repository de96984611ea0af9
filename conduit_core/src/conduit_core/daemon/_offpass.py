"""Executor calls the host loop starts and never waits for (invariant 12).

A pass finds what needs an executor — an ended attempt's stop, an inject or interrupt intent,
the stop after a lost lease — and hands each to :class:`ExecutorCalls`. Each call runs in a task
of its own with its own deadline, at most one per key (an attempt, an intent) at a time, and
after a failure not again before a backoff. So a program that hangs, restarts or fails its
handshake delays only its own attempts' stops and controls; the pass goes on claiming, and the
lease keeper renewing, as if nothing happened. What failed last is kept per key, so the API can
say why an attempt's stop is still unconfirmed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup

from conduit_core.errors import ConduitError

__all__ = ["ExecutorCalls"]

log = logging.getLogger("conduit.daemon")

#: A call: ``None`` when it is done, otherwise why not (it is tried again after a backoff).
Call = Callable[[], Awaitable[str | None]]


@dataclass
class _Failed:
    reason: str
    tries: int
    retry_at: float


class ExecutorCalls:
    """Runs keyed executor calls in tasks of their own; :meth:`running` owns those tasks."""

    def __init__(
        self,
        *,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._clock = clock
        self._tg: TaskGroup | None = None
        self._busy: dict[str, float] = {}  # key -> when its call started
        self._failed: dict[str, _Failed] = {}

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Calls may start inside; leaving cancels the ones still running (a stop, say, that
        never answers must not hold the daemon's exit)."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                yield
            finally:
                self._tg = None
                tg.cancel_scope.cancel()

    def start(self, key: str, what: str, call: Call, *, deadline_s: float) -> bool:
        """Start ``call`` unless one for ``key`` runs or backs off; whether it was started."""
        if self._tg is None or key in self._busy:
            return False
        failed = self._failed.get(key)
        if failed is not None and self._clock() < failed.retry_at:
            return False
        self._busy[key] = self._clock()
        self._tg.start_soon(self._run, key, what, call, deadline_s)
        return True

    def state(self, key: str) -> str | None:
        """What the calls for ``key`` are at, for a person: how long the one under way has run,
        and why the last one failed; ``None`` when none runs and none failed."""
        parts = []
        started = self._busy.get(key)
        if started is not None:
            parts.append(f"a try has been under way for {self._clock() - started:.0f} s")
        failed = self._failed.get(key)
        if failed is not None:
            parts.append(f"try {failed.tries} failed: {failed.reason}")
        return "; ".join(parts) or None

    def busy(self) -> int:
        return len(self._busy)

    def keep_only(self, prefix: str, keys: Iterable[str]) -> None:
        """Forget the failures of ``prefix`` keys not in ``keys`` (settled some other way)."""
        wanted = set(keys)
        for key in [k for k in self._failed if k.startswith(prefix) and k not in wanted]:
            del self._failed[key]

    async def _run(self, key: str, what: str, call: Call, deadline_s: float) -> None:
        reason: str | None = None
        try:
            with anyio.move_on_after(deadline_s) as scope:
                reason = await call()
            if scope.cancelled_caught:
                reason = f"did not finish within {deadline_s:g} s"
        except ConduitError as exc:
            reason = f"[{exc.code}] {exc.message}"
        except Exception as exc:  # one call's bug never takes the host down
            log.exception("%s crashed", what)
            reason = f"crashed: {type(exc).__name__}"
        finally:
            self._busy.pop(key, None)
        if reason is None:
            self._failed.pop(key, None)
            return
        tries = self._failed[key].tries + 1 if key in self._failed else 1
        delay = min(self.backoff_initial_s * 2 ** (tries - 1), self.backoff_max_s)
        self._failed[key] = _Failed(reason=reason, tries=tries, retry_at=self._clock() + delay)
        log.warning("%s failed (try %d): %s; next try in %.1f s", what, tries, reason, delay)
