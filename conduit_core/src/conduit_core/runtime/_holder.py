"""Holding a lease: renew every third of its duration until stopped or refused.

One holder holds an attempt's lease from its claim, through its launch and observation, until it
completes, parks, is stopped or loses the lease. When a renewal is refused the work under the hold
is cancelled at once (not at its next fenced write) and :class:`LeaseLostError` is raised.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from conduit_core.errors import ConduitError, LeaseLostError
from conduit_core.model import Lease
from conduit_core.runtime._clock import Clock
from conduit_core.storage import Store

__all__ = ["HeldLease", "hold_lease"]

log = logging.getLogger("conduit.runtime")


class HeldLease:
    """The current lease of a held attempt (renewals replace it) and whether it was lost."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost: BaseException | None = None
        self.renewals = 0


@asynccontextmanager
async def hold_lease(
    store: Store, clock: Clock, lease: Lease, *, tick_s: float | None = None
) -> AsyncIterator[HeldLease]:
    """Hold ``lease`` for the body; cancel the body and raise ``LeaseLostError`` if it is lost."""
    held = HeldLease(lease)
    interval = tick_s if tick_s is not None else lease.duration_ms / 3000
    async with anyio.create_task_group() as tg:

        async def renew_forever() -> None:
            while True:
                await anyio.sleep(interval)
                try:
                    held.lease = await store.renew_lease(held.lease, now_ms=clock.now_ms())
                    held.renewals += 1
                except (LeaseLostError, ConduitError) as exc:
                    log.warning(
                        "lease lost execution=%s epoch=%s: %s",
                        held.lease.execution_id,
                        held.lease.epoch,
                        exc,
                    )
                    held.lost = exc
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(renew_forever)
        try:
            yield held
        finally:
            tg.cancel_scope.cancel()
    if held.lost is not None:
        raise LeaseLostError(
            f"lease of execution {lease.execution_id!r} epoch {lease.epoch} was lost"
        ) from held.lost
