"""Where the store asks whether a race detector's negative control switched a protection off.

The store reads no switch itself: :func:`conduit_core.extension.protection_off` answers, and it
says "never" unless the test-only plugin is installed (see ``extension/_switches.py`` and
:data:`conduit_core.extension.PROTECTIONS` for the protections).
"""

from __future__ import annotations

from conduit_core.extension import protection_off

__all__ = ["unsafe"]


def unsafe(protection: str) -> bool:
    """Whether a test switched ``protection`` off in this process."""
    return protection_off(protection)
