"""A test harness for executors: an ``ExecutionContext`` whose fenced callbacks are recorded.

It stands in for the runtime: it records launch phases and pins in order, keeps the persisted
recovery metadata (in memory and, optionally, in a JSON file another process can read), and can
refuse writes the way a lost lease does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conduit_core.errors import LeaseLostError
from conduit_core.extension import (
    MAX_RECOVERY_METADATA_BYTES,
    ExecutionContext,
    PhaseOutcome,
)


class RecordingCallbacks:
    """Fenced writes of one attempt, recorded.

    ``lose_lease_before`` names the first write to refuse ("pin", "persist_recovery", or a phase
    name); from then on every write is refused, as after a real lost lease.
    """

    def __init__(
        self, *, metadata_file: Path | None = None, lose_lease_before: str | None = None
    ) -> None:
        self.metadata_file = metadata_file
        self.lose_lease_before = lose_lease_before
        self.lease_lost = False
        self.events: list[tuple[str, ...]] = []
        self.pins: list[str] = []
        self.metadata: dict[str, Any] | None = None
        self.launch_intent: dict[str, Any] | None = None

    @property
    def phases(self) -> list[tuple[str, ...]]:
        return [e for e in self.events if e[0] in ("begin", "end")]

    def _fence(self, write: str) -> None:
        if write == self.lose_lease_before:
            self.lease_lost = True
        if self.lease_lost:
            self.events.append(("refused", write))
            raise LeaseLostError(f"the lease was lost before {write}")

    async def persist_recovery(self, metadata: Mapping[str, Any]) -> None:
        self._fence("persist_recovery")
        encoded = json.dumps(dict(metadata))
        assert len(encoded.encode()) <= MAX_RECOVERY_METADATA_BYTES
        self.metadata = json.loads(encoded)
        self.events.append(("persist_recovery",))
        if self.metadata_file is not None:
            partial = self.metadata_file.with_suffix(".partial")
            partial.write_text(encoded)
            os.replace(partial, self.metadata_file)

    async def record_launch_intent(self, intent: Mapping[str, Any]) -> None:
        self._fence("record_launch_intent")
        self.launch_intent = dict(intent)
        self.events.append(("record_launch_intent",))

    async def begin_phase(self, name: str) -> None:
        self._fence(name)
        self.events.append(("begin", name))

    async def end_phase(self, name: str, outcome: PhaseOutcome) -> None:
        self._fence(f"end:{name}")
        self.events.append(("end", name, str(outcome)))

    async def pin(self, ref: str) -> None:
        self._fence("pin")
        self.pins.append(ref)
        self.events.append(("pin", ref))


def make_context(
    *,
    execution_id: str,
    config: Mapping[str, Any],
    callbacks: RecordingCallbacks,
    epoch: int = 1,
    state_dir: Path | None = None,
    recovery: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    deadline_ms: int | None = None,
) -> ExecutionContext:
    return ExecutionContext(
        execution_id=execution_id,
        work_id=f"work-{execution_id}",
        attempt=1,
        epoch=epoch,
        scope="test",
        binding="container-test",
        executor="container",
        generation=1,
        config=config,
        env=env,
        deadline_ms=deadline_ms,
        recovery=recovery,
        state_dir=str(state_dir) if state_dir is not None else None,
        callbacks=callbacks,
    )
