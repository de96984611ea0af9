"""conduit: a durable execution scheduler; ``conduit_core.extension`` is the plugin contract."""

from conduit_core._version import __version__
from conduit_core.errors import ConduitError
from conduit_core.extension import hookimpl

__all__ = ["ConduitError", "__version__", "hookimpl"]
