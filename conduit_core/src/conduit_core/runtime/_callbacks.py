"""The fenced callbacks an executor reaches through its ExecutionContext.

Launch-trail writes are coalesced to keep round trips per attempt few: the core's own quick phases
(environment) and phase *ends* are buffered and written together with the next fenced write that
has to happen anyway (the invoke mark just before the executor is called, recovery metadata, a
pin, the running status). An executor's own phase *begin* is written at once, so a slow inner step
(a container pull, say) shows while it runs. Every write is fenced by the held lease.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from conduit_core.extension import (
    MAX_LAUNCH_INTENT_BYTES,
    MAX_RECOVERY_METADATA_BYTES,
    OperationError,
    PhaseOutcome,
)
from conduit_core.model import (
    MAX_LAUNCH_PHASES,
    Execution,
    ExecutionStatus,
    Invoke,
    LaunchPhase,
    Segment,
)
from conduit_core.runtime._clock import Clock
from conduit_core.runtime._holder import HeldLease
from conduit_core.storage import Store
from conduit_core.telemetry import segment_event

__all__ = ["StoreCallbacks", "validate_launch_intent", "validate_recovery_metadata"]

SegmentChange = Callable[[Segment], Segment]


def validate_recovery_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Bounded opaque JSON: a JSON object of at most ``MAX_RECOVERY_METADATA_BYTES``."""
    return _bounded_json(metadata, "invalid_recovery_metadata", MAX_RECOVERY_METADATA_BYTES)


def validate_launch_intent(intent: Mapping[str, Any]) -> dict[str, Any]:
    """Bounded opaque JSON: a JSON object of at most ``MAX_LAUNCH_INTENT_BYTES``."""
    return _bounded_json(intent, "invalid_launch_intent", MAX_LAUNCH_INTENT_BYTES)


def _bounded_json(value: Mapping[str, Any], code: str, limit: int) -> dict[str, Any]:
    try:
        encoded = msgspec.json.encode(dict(value))
    except (TypeError, msgspec.EncodeError) as exc:
        raise OperationError(code, f"not JSON: {exc}") from exc
    if len(encoded) > limit:
        raise OperationError(code, f"{len(encoded)} bytes is over the limit of {limit}")
    decoded: dict[str, Any] = msgspec.json.decode(encoded)
    return decoded


class StoreCallbacks:
    """Writes on behalf of one attempt, each fenced by the held lease."""

    def __init__(self, store: Store, clock: Clock, held: HeldLease) -> None:
        self._store = store
        self._clock = clock
        self._held = held
        self._pending: list[SegmentChange] = []
        self.recovery_persisted = False
        self.execution: Execution | None = None

    # --- the AttemptCallbacks protocol ---------------------------------------------------------

    async def persist_recovery(self, metadata: Mapping[str, Any]) -> None:
        """Acknowledged recovery metadata is what makes a launch count as running."""
        checked = validate_recovery_metadata(metadata)

        def running(ex: Execution) -> Execution:
            if not ex.status.live:
                return msgspec.structs.replace(ex, recovery=checked)
            # Recorded under this lease: the attempt runs under this holder, so a recovery
            # hold of an earlier try no longer stands. The open segment remembers that its
            # launch started something (a later "not started" answer contradicts it).
            segments = ex.segments
            if segments and segments[-1].ended_at_ms is None:
                last = msgspec.structs.replace(segments[-1], recovery_persisted=True)
                segments = [*segments[:-1], last]
            return msgspec.structs.replace(
                ex, recovery=checked, status=ExecutionStatus.RUNNING, recovery_hold=None,
                segments=segments,
            )  # fmt: skip

        await self.flush(running)
        self.recovery_persisted = True
        segment_event("recovery_persisted")

    async def record_launch_intent(self, intent: Mapping[str, Any]) -> None:
        """Written at once (with the buffered trail): nothing may start before it is durable."""
        checked = validate_launch_intent(intent)
        await self.flush(lambda ex: msgspec.structs.replace(ex, launch_intent=checked))

    async def begin_phase(self, name: str) -> None:
        """An executor's phase begins: written at once so a slow step shows while it runs."""
        self.buffer_begin(name)
        await self.flush()

    async def end_phase(self, name: str, outcome: PhaseOutcome) -> None:
        self.buffer_end(name, outcome)

    async def pin(self, ref: str) -> None:
        self._pending.append(lambda seg: msgspec.structs.replace(seg, pin=ref))
        await self.flush()

    # --- buffering -----------------------------------------------------------------------------

    def buffer_begin(self, name: str) -> None:
        now = self._clock.now_ms()
        segment_event("launch_phase.begin", {"conduit.phase": name})

        def begin(seg: Segment) -> Segment:
            launch = [*seg.launch, LaunchPhase(name=name, started_at_ms=now)]
            return msgspec.structs.replace(seg, launch=launch[-MAX_LAUNCH_PHASES:])

        self._pending.append(begin)

    def buffer_end(self, name: str, outcome: PhaseOutcome) -> None:
        now = self._clock.now_ms()
        segment_event(
            "launch_phase.end", {"conduit.phase": name, "conduit.phase_outcome": str(outcome)}
        )

        def end(seg: Segment) -> Segment:
            launch = list(seg.launch)
            for i in range(len(launch) - 1, -1, -1):
                if launch[i].name == name and launch[i].ended_at_ms is None:
                    launch[i] = msgspec.structs.replace(launch[i], ended_at_ms=now, outcome=outcome)
                    break
            return msgspec.structs.replace(seg, launch=launch)

        self._pending.append(end)

    def buffer_segment(self, change: SegmentChange) -> None:
        """Write ``change`` to the open segment with the next fenced write."""
        self._pending.append(change)

    def buffer_invoked(self, *, isolated: bool) -> None:
        """The executor is about to be called (``Invoke`` called, with ``Isolated``)."""
        segment_event("invoke", {"conduit.isolated": isolated})
        self._pending.append(
            lambda seg: msgspec.structs.replace(seg, invoke=Invoke.CALLED, isolated=isolated)
        )

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def take_pending(self) -> Callable[[Execution], Execution]:
        """The buffered trail as one change to the attempt (its open segment)."""
        changes, self._pending = self._pending, []

        def apply(ex: Execution) -> Execution:
            if not changes or not ex.segments or ex.segments[-1].ended_at_ms is not None:
                return ex
            seg = ex.segments[-1]
            for change in changes:
                seg = change(seg)
            return msgspec.structs.replace(ex, segments=[*ex.segments[:-1], seg])

        return apply

    async def flush(self, also: Callable[[Execution], Execution] | None = None) -> Execution:
        """Write the buffered trail (and ``also``) in one fenced transaction."""
        trail = self.take_pending()

        def change(ex: Execution) -> Execution:
            ex = trail(ex)
            return also(ex) if also is not None else ex

        self.execution = await self._store.update_attempt(
            self._held.lease, change, now_ms=self._clock.now_ms()
        )
        return self.execution
