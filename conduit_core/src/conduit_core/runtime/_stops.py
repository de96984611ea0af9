"""Physical stops: stop what an attempt may have left running, confirm its exclusion only when
the stop is verified (invariant 6a: an unverified stop keeps the attempt's slot and blocks its
Work)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from conduit_core.errors import LeaseLostError, UnsupportedGenerationError
from conduit_core.extension import StopTarget
from conduit_core.model import Execution, Lease
from conduit_core.plugins import Plugins
from conduit_core.runtime._clock import Clock
from conduit_core.storage import Store

__all__ = ["Stops", "stop_target"]

log = logging.getLogger("conduit.runtime")


class Stops:
    """``Stops(store, clock, plugins, state_dir)``: the stop/confirm pass and the stops after
    lost leases (``state_dir``: the executor's own directory, by executor name)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        plugins: Plugins,
        state_dir: Callable[[str], str | None] = lambda executor: None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.plugins = plugins
        self.state_dir = state_dir

    def target(self, execution: Execution, *, epoch: int | None = None) -> StopTarget:
        return stop_target(execution, self.state_dir(execution.snapshot.executor), epoch=epoch)

    async def stop_and_confirm(self, execution_id: str) -> bool:
        """Stop what the attempt may have left running; confirm its exclusion when verified."""
        execution = await self.store.get_execution(execution_id)
        if execution.exclusion_confirmed:
            return True
        snap = execution.snapshot
        try:
            executor = self.plugins.executor(snap.executor, snap.executor_generation)
        except UnsupportedGenerationError as exc:
            log.error("cannot stop execution=%s: %s", execution.id, exc.message)
            return False
        target = self.target(execution)
        try:
            evidence = await executor.stop(target)
        except Exception as exc:
            log.warning(
                "stop failed execution=%s epoch=%s cause=%s",
                execution.id, execution.epoch, type(exc).__name__,
            )  # fmt: skip
            return False
        if not evidence.verified:
            return False
        try:
            await self.store.confirm_stopped(
                execution.id, execution.epoch, now_ms=self.clock.now_ms()
            )
        except LeaseLostError:
            return False  # adopted at another epoch since: not ours to confirm
        return True

    async def confirm_unexcluded(self) -> int:
        """The stop/confirm pass over ended attempts whose exclusion is unconfirmed."""
        confirmed = 0
        for execution in await self.store.unconfirmed_exclusions():
            if not execution.status.terminal:
                continue  # an unfinished attempt belongs to its holder or to recovery
            confirmed += await self.stop_and_confirm(execution.id)
        return confirmed

    async def handle_lost_lease(self, lease: Lease) -> bool:
        """After a host lost a lease: stop and confirm only when recovery no longer owns it.

        A lease that merely lapsed on a running attempt is left for recovery to adopt. Returns
        whether a stop was confirmed.
        """
        if await self.store.adoptable(lease):
            return False
        return await self.stop_and_confirm(lease.execution_id)


def stop_target(
    execution: Execution, state_dir: str | None, *, epoch: int | None = None
) -> StopTarget:
    """What a stop, interrupt or inject of ``execution`` names: with no recovery metadata, its
    launch intent and the executor's state dir find exactly that launch's resources."""
    return StopTarget(
        execution_id=execution.id,
        epoch=epoch if epoch is not None else execution.epoch,
        work_id=execution.work_id,
        config=dict(execution.snapshot.binding_config),
        recovery=execution.recovery,
        launch_intent=execution.launch_intent,
        state_dir=state_dir,
    )
