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

    def may_hold(self, request: GateRequest) -> bool:
        """Whether :meth:`check` could hold this start; ``False`` lets it start unasked.

        Asked first, for every first start capacity lets through, so that Work no gate would
        hold is claimed in one transaction, with no question and no second transaction. It must
        be quick and synchronous, with no I/O: it runs inside the claim's transaction. Raising
        counts as ``True``. The default, ``True``, asks :meth:`check` about every first start.
        """
        return True

    @abstractmethod
    async def check(self, request: GateRequest) -> StartHold | None:
        """Return ``None`` to let the start go on, or a :class:`StartHold` to hold it.

        Raising fails closed: nothing is held and the gate is asked again on the next pass.
        """
