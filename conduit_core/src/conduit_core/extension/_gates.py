"""Start gates: asked before a Work's first attempt, they let it start or hold it for a reason."""

from __future__ import annotations

from abc import ABC, abstractmethod

import msgspec

from conduit_core.extension._executor import InputEvent

__all__ = ["GateRequest", "StartGate", "StartHold"]


class StartHold(msgspec.Struct, frozen=True, kw_only=True):
    """A gate's answer that holds the start; ``reason`` is shown to the person who settles it."""

    reason: str


class GateRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What a gate sees: the Work, the binding its first attempt would run and its first input."""

    work_id: str
    scope: str
    kind: str
    binding: str
    executor: str
    first_input: InputEvent | None = None


class StartGate(ABC):
    """A start gate. Called outside any transaction, only once capacity allows the start."""

    @abstractmethod
    async def check(self, request: GateRequest) -> StartHold | None:
        """Return ``None`` to let the start go on, or a :class:`StartHold` to hold it.

        Raising fails closed: nothing is held and the gate is asked again on the next pass.
        """
