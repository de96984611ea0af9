"""The storage conformance suite, on SQLite and on PostgreSQL (see conftest.py)."""

from conduit_core.storage.conformance import *  # noqa: F403
from conduit_core.storage.conformance_daemons import *  # noqa: F403
from conduit_core.storage.conformance_recovery import *  # noqa: F403
from conduit_core.storage.conformance_routines import *  # noqa: F403
