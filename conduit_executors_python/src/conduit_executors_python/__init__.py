"""conduit executor ``python``: a Python callable run as a detached job that outlives the daemon.

A function raises :class:`Retry` or :class:`Permanent` to steer its retry. The plugin entry point
is :mod:`conduit_executors_python.plugin`; the executor itself is
:class:`conduit_executors_python.executor.PythonExecutor`. This module imports nothing of conduit,
so a job's interpreter loads it cheaply.
"""

from conduit_executors_python._signals import Permanent, Retry

__all__ = ["Permanent", "Retry"]
