"""conduit: a durable execution scheduler; ``conduit_core.extension`` is the plugin contract."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conduit_core._version import __version__
from conduit_core.errors import ConduitError

if TYPE_CHECKING:
    from conduit_core.extension import hookimpl

__all__ = ["ConduitError", "__version__", "hookimpl"]


def __getattr__(name: str) -> Any:
    # The plugin contract loads on first use, so ``conduit --help`` does not pay for it.
    if name == "hookimpl":
        from conduit_core.extension import hookimpl

        return hookimpl
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
