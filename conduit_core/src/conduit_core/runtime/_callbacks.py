"""The fenced callbacks an executor reaches through its ExecutionContext."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from conduit_core.extension import MAX_RECOVERY_METADATA_BYTES, OperationError, PhaseOutcome
from conduit_core.runtime._clock import Clock
from conduit_core.runtime._holder import HeldLease
from conduit_core.storage import Store

__all__ = ["StoreCallbacks", "validate_recovery_metadata"]


def validate_recovery_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Bounded opaque JSON: a JSON object of at most ``MAX_RECOVERY_METADATA_BYTES``."""
    try:
        encoded = msgspec.json.encode(dict(metadata))
    except (TypeError, msgspec.EncodeError) as exc:
        raise OperationError("invalid_recovery_metadata", f"not JSON: {exc}") from exc
    if len(encoded) > MAX_RECOVERY_METADATA_BYTES:
        raise OperationError(
            "invalid_recovery_metadata",
            f"{len(encoded)} bytes is over the limit of {MAX_RECOVERY_METADATA_BYTES}",
        )
    decoded: dict[str, Any] = msgspec.json.decode(encoded)
    return decoded


class StoreCallbacks:
    """Writes on behalf of one attempt, each fenced by the held lease."""

    def __init__(self, store: Store, clock: Clock, held: HeldLease) -> None:
        self._store = store
        self._clock = clock
        self._held = held
        self.recovery_persisted = False

    async def persist_recovery(self, metadata: Mapping[str, Any]) -> None:
        checked = validate_recovery_metadata(metadata)
        await self._store.persist_recovery(self._held.lease, checked, now_ms=self._clock.now_ms())
        self.recovery_persisted = True

    async def begin_phase(self, name: str) -> None:
        await self._store.begin_launch_phase(self._held.lease, name, now_ms=self._clock.now_ms())

    async def end_phase(self, name: str, outcome: PhaseOutcome) -> None:
        await self._store.end_launch_phase(
            self._held.lease, name, outcome, now_ms=self._clock.now_ms()
        )

    async def pin(self, ref: str) -> None:
        await self._store.pin_segment(self._held.lease, ref, now_ms=self._clock.now_ms())
