"""What the executor benches share: a minimal host that persists recovery metadata to a file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conduit_core.extension import PhaseOutcome

__all__ = ["JsonFileCallbacks"]


class JsonFileCallbacks:
    """Fenced callbacks of a bench host: recovery metadata written and renamed, nothing else."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def persist_recovery(self, metadata: Mapping[str, Any]) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(dict(metadata)))
        partial.replace(self.path)

    async def record_launch_intent(self, intent: Mapping[str, Any]) -> None:
        pass

    async def begin_phase(self, name: str) -> None:
        pass

    async def end_phase(self, name: str, outcome: PhaseOutcome) -> None:
        pass

    async def pin(self, ref: str) -> None:
        pass
