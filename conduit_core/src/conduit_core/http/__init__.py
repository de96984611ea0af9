"""The daemon's HTTP API: typed bodies, the operations behind them, the app and a client.

``ApiService`` holds the semantics (the CLI calls it directly when no daemon runs);
``create_app`` serves it over HTTP with a bearer token; ``ApiClient`` calls a running daemon.
"""

from conduit_core.http._app import ROUTES, create_app, status_for
from conduit_core.http._approvals import (
    NeedsYouView,
    SettledView,
    SettleRequest,
    approve,
    list_needs_you,
    refuse,
    release,
)
from conduit_core.http._client import ApiClient, split_listen
from conduit_core.http._guard import RequestGuard
from conduit_core.http._metrics import (
    METRICS_PATH,
    MetricsEndpoint,
    stored_state_metrics,
    with_metrics,
)
from conduit_core.http._openapi import openapi_document
from conduit_core.http._schemas import (
    MAX_BATCH_ITEMS,
    AttemptView,
    BatchItemResult,
    BatchSubmitRequest,
    BatchSubmitResult,
    CancelRequest,
    CapacityView,
    ConfirmStoppedRequest,
    ErrorBody,
    EventView,
    Health,
    InputRequest,
    InputView,
    InterruptRequest,
    PoolCapacity,
    ProgramView,
    RetryRequest,
    ScopeCapacity,
    SubmitRequest,
    Waiting,
    WorkDetail,
    WorkPage,
    WorkView,
)
from conduit_core.http._service import GLOBAL_POOL, ApiService, HostHooks, NoHost, new_work_id
from conduit_core.http._token import ensure_token, read_token

__all__ = [
    "MAX_BATCH_ITEMS",
    "METRICS_PATH",
    "ApiClient",
    "ApiService",
    "AttemptView",
    "BatchItemResult",
    "BatchSubmitRequest",
    "BatchSubmitResult",
    "CancelRequest",
    "CapacityView",
    "ConfirmStoppedRequest",
    "ErrorBody",
    "EventView",
    "GLOBAL_POOL",
    "Health",
    "HostHooks",
    "InputRequest",
    "InputView",
    "InterruptRequest",
    "MetricsEndpoint",
    "NeedsYouView",
    "NoHost",
    "PoolCapacity",
    "ProgramView",
    "ROUTES",
    "RequestGuard",
    "RetryRequest",
    "ScopeCapacity",
    "SettleRequest",
    "SettledView",
    "SubmitRequest",
    "Waiting",
    "WorkDetail",
    "WorkPage",
    "WorkView",
    "approve",
    "create_app",
    "ensure_token",
    "list_needs_you",
    "new_work_id",
    "openapi_document",
    "read_token",
    "refuse",
    "release",
    "split_listen",
    "status_for",
    "stored_state_metrics",
    "with_metrics",
]
