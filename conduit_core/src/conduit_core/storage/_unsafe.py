"""Where the store asks whether a race detector's negative control switched a protection off.

The store reads no switch itself: :func:`conduit_core.extension.protection_off` answers, and it
says "never" unless the test-only plugin is installed (see ``extension/_switches.py`` and
:data:`conduit_core.extension.PROTECTIONS` for the protections).
"""

from __future__ import annotations

from conduit_core.extension import fault_point_sync, protection_off

__all__ = ["fault", "unsafe"]


def unsafe(protection: str) -> bool:
    """Whether a test switched ``protection`` off in this process."""
    return protection_off(protection)


def fault(point: str) -> None:
    """A store fault point (``store.capacity_counted``): a test may wait there to widen a race's
    window, or kill the process; inert unless the test plugin is installed."""
    fault_point_sync(point)
