"""Waking the host loop: a local event for writes in this process, LISTEN/NOTIFY on PostgreSQL
for writes of other daemons and CLIs sharing the store. The periodic rescan is the safety net."""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import TaskStatus

__all__ = ["READY_KIND", "WAKE_CHANNEL", "PgWakeChannel", "Waker", "notify_sync"]

log = logging.getLogger("conduit.daemon")

#: The PostgreSQL channel every daemon listens on.
WAKE_CHANNEL = "conduit_wake"
#: Appended to a NOTIFY's payload (after the sender's owner and a space) when every write it
#: announces only made Work ready or freed a slot: a listener then claims, without a whole
#: pass. A payload without it (a daemon's other writes, the CLI's, an older daemon's) wakes one.
READY_KIND = "ready"
_READY_SUFFIX = f" {READY_KIND}"
_MAX_BACKOFF_S = 10.0
#: The least time between two NOTIFYs of one daemon. The first write after a quiet spell is
#: announced at once; those made within this time after are announced together, by one NOTIFY
#: at its end. Without it a busy daemon sent one per ended attempt as fast as round trips
#: allowed (hundreds a second), each a transaction for the server and a wake-up for every
#: daemon listening, itself included; with it, at most 50 a second, and another daemon learns of
#: a write at most this much later.
NOTIFY_INTERVAL_S = 0.02


class Waker:
    """One pending wake-up: ``poke`` sets it; ``wait`` returns when poked or after a while."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def poke(self) -> None:
        self._event.set()

    async def wait(self, at_most_s: float) -> bool:
        """True if poked (not timed out). The wake is consumed before returning, so a poke
        during the pass that follows wakes the next wait at once."""
        with anyio.move_on_after(at_most_s):
            await self._event.wait()
        poked = self._event.is_set()
        self._event = anyio.Event()
        return poked


class PgWakeChannel:
    """LISTEN on ``conduit_wake`` (poking the local waker, or calling ``on_ready`` for another
    daemon's ready-only writes) and NOTIFY after local writes."""

    def __init__(
        self,
        url: str,
        waker: Waker,
        *,
        owner: str,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self._url = url
        self._waker = waker
        self._owner = owner
        #: Called for another daemon's ``ready`` NOTIFY (without it, the waker is poked).
        self.on_ready = on_ready
        self._send_needed = anyio.Event()
        #: Whether a write since the last NOTIFY needs the listeners' whole pass.
        self._pass_needed = False
        self.listening = False
        self._lost = False

    def notify(self) -> None:
        """Ask the sender task to NOTIFY (coalesced: at most one per ``NOTIFY_INTERVAL_S``,
        none lost: a request made while the sender waits out the interval is sent at its end)."""
        self._pass_needed = True
        self._send_needed.set()

    def notify_ready(self) -> None:
        """As :meth:`notify`, for a write that only made Work ready or freed a slot: unless
        another write of the same interval needs more, the listeners only claim."""
        self._send_needed.set()

    def _heard(self, payload: str) -> None:
        sender, ready = payload.removesuffix(_READY_SUFFIX), payload.endswith(_READY_SUFFIX)
        if sender == self._owner:
            return
        if ready and self.on_ready is not None:
            self.on_ready()
        else:
            self._waker.poke()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        started = False

        def ready() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        async with anyio.create_task_group() as tg:
            tg.start_soon(self._sender)
            failures = 0  # consecutive failed connections: the backoff's exponent
            while True:
                try:
                    await self._listen(ready)
                except Exception as exc:  # a lost connection: reconnect, the rescan covers the gap
                    if self.listening:
                        failures = 0  # it was up: this is a new loss
                    if not self._lost:
                        log.info("wake channel lost (%s); reconnecting with backoff, the rescan "
                                 "covers the gap", type(exc).__name__)  # fmt: skip
                    self._lost = True
                self.listening = False
                ready()  # a daemon without its channel still works, on the rescan
                pause = min(_MAX_BACKOFF_S, 0.5 * 2 ** min(failures, 16))
                await anyio.sleep(pause * random.uniform(0.75, 1.25))
                failures += 1

    async def _listen(self, ready: Callable[[], None]) -> None:
        import psycopg

        conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True, connect_timeout=5)
        async with conn:
            await conn.execute(f"LISTEN {WAKE_CHANNEL}")
            if self._lost:
                log.info("wake channel listening again")
            self._lost = False
            self.listening = True
            # Writes of other daemons during the gap sent no wake we could hear: rescan now.
            self._waker.poke()
            ready()
            async for note in conn.notifies():
                self._heard(note.payload)

    async def _sender(self) -> None:
        import psycopg

        conn: Any = None
        try:
            while True:
                await self._send_needed.wait()
                self._send_needed = anyio.Event()
                payload = self._owner if self._pass_needed else self._owner + _READY_SUFFIX
                self._pass_needed = False
                try:
                    if conn is None or conn.closed:
                        conn = await psycopg.AsyncConnection.connect(
                            self._url, autocommit=True, connect_timeout=5
                        )
                    await conn.execute("SELECT pg_notify(%s, %s)", (WAKE_CHANNEL, payload))
                except Exception as exc:
                    # A lost store is reported by the host; the rescan covers the missed wake.
                    log.debug("wake notify failed (%s)", type(exc).__name__)
                    if conn is not None:
                        await _close_quietly(conn)
                    conn = None
                await anyio.sleep(NOTIFY_INTERVAL_S)
        finally:
            if conn is not None:  # stopped (the daemon exits): close it, not leave it to GC
                with anyio.CancelScope(shield=True):
                    await _close_quietly(conn)


async def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):
        await conn.close()


def notify_sync(url: str, sender: str = "cli") -> None:
    """NOTIFY the daemons sharing a PostgreSQL store (the CLI's direct writes)."""
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (WAKE_CHANNEL, sender))
