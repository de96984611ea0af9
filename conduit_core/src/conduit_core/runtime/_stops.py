"""Physical stops: stop what an attempt may have left running, confirm its exclusion only when
the stop is verified (invariant 6a: an unverified stop keeps the attempt's slot and blocks its
Work).

:meth:`Stops.try_stop` says why a stop did not confirm, so a host that runs each stop in a task
of its own (the daemon, invariant 12) can show the reason and back off; ``stop_and_confirm`` and
``confirm_unexcluded`` are the same stops awaited in line, for callers without such a host.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from conduit_core.errors import ConduitError, LeaseLostError, UnsupportedGenerationError
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

    async def try_stop(self, execution_id: str) -> str | None:
        """Stop what the attempt may have left running and confirm its exclusion when the stop
        is verified: ``None`` when nothing is left to do, otherwise why (for a log line or a
        status)."""
        return (await self._stop(execution_id))[1]

    async def stop_and_confirm(self, execution_id: str) -> bool:
        """Stop what the attempt may have left running; confirm its exclusion when verified."""
        return (await self._stop(execution_id))[0]

    async def _stop(self, execution_id: str) -> tuple[bool, str | None]:
        """(whether the exclusion is confirmed, why not when there is more to do)."""
        execution = await self.store.get_execution(execution_id)
        if execution.exclusion_confirmed:
            return True, None
        snap = execution.snapshot
        try:
            executor = self.plugins.executor(snap.executor, snap.executor_generation)
        except UnsupportedGenerationError as exc:
            log.error("cannot stop execution=%s: %s", execution.id, exc.message)
            return False, exc.message
        target = self.target(execution)
        try:
            evidence = await executor.stop(target)
        except Exception as exc:
            reason = _failure(exc)
            log.warning(
                "stop failed execution=%s epoch=%s executor=%s: %s",
                execution.id, execution.epoch, snap.executor, reason,
            )  # fmt: skip
            return False, f"executor {snap.executor!r}: stop failed: {reason}"
        if not evidence.verified:
            detail = f": {evidence.detail}" if evidence.detail else ""
            return False, f"executor {snap.executor!r} could not verify the stop{detail}"
        try:
            await self.store.confirm_stopped(
                execution.id, execution.epoch, now_ms=self.clock.now_ms()
            )
        except LeaseLostError:
            # Adopted at another epoch since: not ours to confirm, and nothing left to retry.
            return False, None
        return True, None

    async def due(self) -> list[Execution]:
        """Ended attempts whose exclusion is unconfirmed: each needs a (verified) stop."""
        # An unfinished attempt belongs to its holder or to recovery.
        return [ex for ex in await self.store.unconfirmed_exclusions() if ex.status.terminal]

    async def confirm_unexcluded(self) -> int:
        """The stop/confirm pass over ended attempts whose exclusion is unconfirmed, in line."""
        confirmed = 0
        for execution in await self.due():
            confirmed += await self.stop_and_confirm(execution.id)
        return confirmed

    async def needs_stop_after(self, lease: Lease) -> bool:
        """After a host lost ``lease``: whether to stop the attempt (recovery no longer owns it).

        A lease that merely lapsed on a running attempt is left for recovery to adopt."""
        return not await self.store.adoptable(lease)

    async def handle_lost_lease(self, lease: Lease) -> bool:
        """After a host lost a lease: stop and confirm only when recovery no longer owns it.

        Returns whether a stop was confirmed.
        """
        if not await self.needs_stop_after(lease):
            return False
        return await self.stop_and_confirm(lease.execution_id)


def _failure(exc: Exception) -> str:
    """A stop's error as an operator reads it: its code and message, or only its type."""
    if isinstance(exc, ConduitError):
        return f"[{exc.code}] {exc.message}"
    return type(exc).__name__
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
