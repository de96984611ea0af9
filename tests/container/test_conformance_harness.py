"""The executor conformance suite (``conduit_core.testing.executor``) against the container
executor and a real Docker Engine (the ``executor_subject`` fixture is in conftest.py)."""

from conduit_core.testing.executor import *  # noqa: F403
