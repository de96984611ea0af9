"""What a keyed submit carries and answers (dedup and debounce; docs/dedup.md)."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

import msgspec

from conduit_core.model import Work

__all__ = ["DedupScope", "SubmitKey", "Submitted"]


class DedupScope(StrEnum):
    """How long a dedup key refers to the Work created under it."""

    QUEUED = "queued"  # until the Work's first attempt starts
    ACTIVE = "active"  # until the Work ends (completed, failed, cancelled)
    WINDOW = "window"  # for ``window_ms`` after the Work was created, whatever its state


class SubmitKey(msgspec.Struct, frozen=True, kw_only=True):
    """A submit's key: a dedup key with its scope, or a debounce key (``quiet_ms`` set)."""

    key: str
    scope: DedupScope = DedupScope.QUEUED
    window_ms: int = 0
    #: Debounce: push the start to last submit + ``quiet_ms`` …
    quiet_ms: int | None = None
    #: … but never past first submit + ``max_wait_ms``.
    max_wait_ms: int | None = None

    @property
    def debounced(self) -> bool:
        return self.quiet_ms is not None

    @property
    def kind(self) -> str:
        return "debounce" if self.debounced else "dedup"


class Submitted(NamedTuple):
    """The Work a keyed submit answers with, and whether it was an existing one."""

    work: Work
    deduplicated: bool
