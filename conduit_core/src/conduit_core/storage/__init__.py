"""Durable storage: the ``Store`` contract, its SQLite and PostgreSQL backends, ``open_store``.

The conformance suite every backend passes is :mod:`conduit_core.storage.conformance`.
"""

from conduit_core.model import EXHAUSTED, listed_status
from conduit_core.storage._admission import (
    BUDGET_EXCEEDED,
    BUDGET_SCHEMA,
    BUDGET_WARNING,
    AdmitRequest,
    BudgetPolicy,
    GateFilter,
    GateVerdict,
    LedgerSpec,
    NoBudgets,
    PendingUsage,
)
from conduit_core.storage._contract import (
    AttemptEnd,
    Candidate,
    CapacityLimits,
    Claim,
    ClaimRefusal,
    ClaimRequest,
    Decision,
    ExecutionChange,
    KeyWaiting,
    NotEligibleError,
    RecoveryRefusal,
    Settlement,
    StaleDispatchError,
    Store,
    WorkChange,
    refusal_error,
)
from conduit_core.storage._open import mask_url, open_store, open_store_sync
from conduit_core.storage._ops_budgets import needs_gates
from conduit_core.storage._ops_routines import RoutineRun, RoutineUpdate
from conduit_core.storage._schema import SCHEMA_VERSION
from conduit_core.storage._sqlite import SqliteStore
from conduit_core.storage._sqlstore import SqlStore
from conduit_core.storage._submit_key import DedupScope, SubmitKey, Submitted
from conduit_core.storage._work_search import WorkQuery

__all__ = [
    "BUDGET_EXCEEDED",
    "BUDGET_SCHEMA",
    "BUDGET_WARNING",
    "EXHAUSTED",
    "SCHEMA_VERSION",
    "AdmitRequest",
    "BudgetPolicy",
    "GateFilter",
    "GateVerdict",
    "KeyWaiting",
    "LedgerSpec",
    "NoBudgets",
    "PendingUsage",
    "AttemptEnd",
    "CapacityLimits",
    "Candidate",
    "Claim",
    "ClaimRefusal",
    "ClaimRequest",
    "Decision",
    "DedupScope",
    "ExecutionChange",
    "NotEligibleError",
    "RecoveryRefusal",
    "RoutineRun",
    "RoutineUpdate",
    "Settlement",
    "SqlStore",
    "SqliteStore",
    "StaleDispatchError",
    "Store",
    "SubmitKey",
    "Submitted",
    "WorkChange",
    "WorkQuery",
    "mask_url",
    "needs_gates",
    "open_store",
    "open_store_sync",
    "listed_status",
    "refusal_error",
]
