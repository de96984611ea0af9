"""Holding a lease: renew every third of its duration until stopped or refused.

One holder holds an attempt's lease from its claim, through its launch and observation, until it
completes, parks, is stopped or loses the lease. When a renewal is refused the work under the hold
is cancelled at once (not at its next fenced write) and :class:`LeaseLostError` is raised.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType

import anyio

from conduit_core.errors import ConduitError, LeaseLostError
from conduit_core.model import Lease
from conduit_core.runtime._clock import Clock
from conduit_core.storage import Store
from conduit_core.telemetry import METRICS

__all__ = ["HeldLease", "LeaseKeeper", "hold_lease"]

log = logging.getLogger("conduit.runtime")


class HeldLease:
    """The current lease of a held attempt (renewals replace it) and whether it was lost."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost: BaseException | None = None
        self.renewals = 0
        #: Set while the holder's own write ends the lease (settle, hold): a renewal refused
        #: then raced that write and is no loss; the write's own fence says if it was.
        self.ending = False

    @asynccontextmanager
    async def ending_write(self) -> AsyncIterator[None]:
        """Mark the body's lease-ending write (cleared again if it fails)."""
        self.ending = True
        try:
            yield
        except BaseException:
            self.ending = False
            raise


def _lost(lease: Lease) -> LeaseLostError:
    """What a hold raises once its body was cancelled for a refused renewal."""
    return LeaseLostError(f"lease of execution {lease.execution_id!r} epoch {lease.epoch} was lost")


@asynccontextmanager
async def hold_lease(
    store: Store, clock: Clock, lease: Lease, *, tick_s: float | None = None
) -> AsyncIterator[HeldLease]:
    """Hold ``lease`` for the body; cancel the body and raise ``LeaseLostError`` if it is lost."""
    held = HeldLease(lease)
    completed = False
    interval = tick_s if tick_s is not None else lease.duration_ms / 3000
    async with anyio.create_task_group() as tg:

        async def renew_forever() -> None:
            while True:
                await anyio.sleep(interval)
                try:
                    held.lease = await store.renew_lease(held.lease, now_ms=clock.now_ms())
                    held.renewals += 1
                    METRICS.lease_renewals.inc()
                except (LeaseLostError, ConduitError) as exc:
                    if held.ending:
                        return  # raced the body's own settle or hold: not a loss
                    log.warning(
                        "lease lost execution=%s epoch=%s: %s",
                        held.lease.execution_id,
                        held.lease.epoch,
                        exc,
                    )
                    held.lost = exc
                    METRICS.lease_losses.inc()
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(renew_forever)
        try:
            yield held
            completed = True
        finally:
            tg.cancel_scope.cancel()
    # A renewal refused after the body finished (it settled the attempt) is no loss.
    if held.lost is not None and not completed:
        raise _lost(lease) from held.lost


class LeaseKeeper:
    """One task that renews every held lease, instead of a renewal task per attempt.

    Each lease is renewed once a third of its duration has passed since its last renewal;
    concurrent renewals share store transactions (group commit). A refused renewal cancels the
    holder's body at once, exactly like :func:`hold_lease`.
    """

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._held: dict[tuple[str, int], tuple[HeldLease, anyio.CancelScope, float]] = {}
        self._changed = anyio.Event()
        #: When ``run`` looks at the held leases next (loop time): a hold due before then wakes
        #: it, any other waits for it (every attempt's hold woke it, ~15 µs each).
        self._wakes_at = math.inf

    def _due_at(self, lease: Lease) -> float:
        """When a third of the lease has passed since it was granted (in loop time).

        Counted from its expiry, not from when the hold began: a claim that waited for its
        commit (a thousand recovery claims at once) is renewed in time, not a third of a lease
        after it was already partly spent.
        """
        remaining_s = (lease.expires_at_ms - self._clock.now_ms()) / 1000
        return anyio.current_time() + max(0.0, remaining_s - lease.duration_ms * 2 / 3000)

    async def run(self) -> None:
        """Renew until cancelled (run it in the host's task group)."""
        while True:
            tick = min((h.lease.duration_ms for h, _, _ in self._held.values()), default=6000)
            self._wakes_at = anyio.current_time() + tick / 6000
            with anyio.move_on_after(tick / 6000):
                await self._changed.wait()
                self._changed = anyio.Event()
            # Until it waits again, every new hold wakes it (it may have counted without them).
            self._wakes_at = math.inf
            now = anyio.current_time()
            due = [key for key, (_, _, next_at) in self._held.items() if next_at <= now]
            if due:
                await self._renew(due)

    async def _renew(self, due: list[tuple[str, int]]) -> None:
        """Renew every due lease in one store call (a thousand held leases renew in one
        transaction, not a thousand)."""
        leases = [self._held[key][0].lease for key in due if key in self._held]
        try:
            renewed = await self._store.renew_leases(leases, now_ms=self._clock.now_ms())
        except ConduitError as exc:
            # Debug only: a store outage fails every renewal each tick; the host reports the
            # outage once, and a lease it costs is logged as lost. Retried on the next tick.
            log.debug("lease renewal of %d lease(s) failed, retrying: %s", len(leases), exc)
            return
        fresh = {(lease.execution_id, lease.epoch): lease for lease in renewed}
        for key in due:
            entry = self._held.get(key)
            if entry is None:
                continue  # released meanwhile: the attempt settled, nothing was lost
            held, scope, _ = entry
            lease = fresh.get(key)
            if lease is not None and lease.token == held.lease.token:
                held.lease = lease
                held.renewals += 1
                METRICS.lease_renewals.inc()
                self._held[key] = (held, scope, self._due_at(lease))
                continue
            if held.ending:
                continue  # raced the holder's own settle or hold: not a loss
            # INFO: the holder's caller says whether this was a loss or a cancel (the daemon
            # logs "attempt lost its lease" at WARNING, "attempt cancelled" at INFO).
            log.info("lease renewal refused execution=%s epoch=%s", key[0], key[1])
            held.lost = LeaseLostError(
                f"attempt {key[0]} epoch {key[1]}: the lease was refused at renewal "
                "(expired, released or superseded)"
            )
            METRICS.lease_losses.inc()
            scope.cancel()

    def hold(self, lease: Lease) -> AbstractAsyncContextManager[HeldLease]:
        """Hold ``lease`` for the body: renewed by this keeper, the body cancelled and
        ``LeaseLostError`` raised if a renewal is refused."""
        return _KeptHold(self, lease)


class _KeptHold:
    """One hold of a :class:`LeaseKeeper` (a class, not a generator: entered per attempt)."""

    __slots__ = ("_held", "_keeper", "_key", "_scope")

    def __init__(self, keeper: LeaseKeeper, lease: Lease) -> None:
        self._keeper = keeper
        self._held = HeldLease(lease)
        self._key = (lease.execution_id, lease.epoch)
        self._scope = anyio.CancelScope()

    async def __aenter__(self) -> HeldLease:
        keeper = self._keeper
        due = keeper._due_at(self._held.lease)
        self._scope.__enter__()
        keeper._held[self._key] = (self._held, self._scope, due)
        if due < keeper._wakes_at:
            keeper._changed.set()  # due before the keeper looks again: it looks now
        return self._held

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._keeper._held.pop(self._key, None)
        swallowed = bool(self._scope.__exit__(exc_type, exc, tb))
        held = self._held
        # The keeper cancelled the body: its lease was lost. A renewal refused after the body
        # finished (it settled the attempt) is no loss.
        if swallowed and held.lost is not None:
            raise _lost(held.lease) from held.lost
        return swallowed
