"""A typed Python client of a running conduit daemon's HTTP API (docs/python.md,
"Submitting from application code").

``Client`` blocks; ``AsyncClient`` is its async twin. Both find the daemon from their
arguments, else ``CONDUIT_URL`` / ``CONDUIT_TOKEN``, else the conduit config file. Importing
this package loads neither the daemon, the runtime nor a store.
"""

from conduit_core.client._address import CONFIG_ENV, TOKEN_ENV, URL_ENV
from conduit_core.client._async import AsyncClient
from conduit_core.client._calls import MAX_BATCH_ITEMS, outcome
from conduit_core.client._errors import (
    ConduitClientError,
    Conflict,
    DaemonUnavailable,
    InvalidRequest,
    NotFound,
    Unauthorized,
    WaitTimeout,
    error_for,
)
from conduit_core.client._sync import Client
from conduit_core.client._types import (
    TERMINAL_STATUSES,
    AttemptResult,
    AttemptView,
    BatchItemResult,
    BatchResult,
    DaemonList,
    DaemonView,
    Debounce,
    DrainView,
    InputAccepted,
    Outcome,
    Settled,
    SubmitItem,
    Waiting,
    WorkDetail,
    WorkPage,
    WorkView,
)

__all__ = [
    "CONFIG_ENV",
    "MAX_BATCH_ITEMS",
    "TERMINAL_STATUSES",
    "TOKEN_ENV",
    "URL_ENV",
    "AsyncClient",
    "AttemptResult",
    "AttemptView",
    "BatchItemResult",
    "BatchResult",
    "Client",
    "ConduitClientError",
    "Conflict",
    "DaemonList",
    "DaemonUnavailable",
    "DaemonView",
    "DrainView",
    "InputAccepted",
    "InvalidRequest",
    "NotFound",
    "Outcome",
    "Settled",
    "Debounce",
    "SubmitItem",
    "Unauthorized",
    "WaitTimeout",
    "Waiting",
    "WorkDetail",
    "WorkPage",
    "WorkView",
    "error_for",
    "outcome",
]
