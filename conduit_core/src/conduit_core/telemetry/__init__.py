"""Telemetry: Prometheus instruments (always on, hot-path cheap) and optional OpenTelemetry traces.

The lowest layer beside ``errors``: storage, runtime and routines record into it; the HTTP layer
exposes it at ``/metrics``; the daemon enables tracing from its config. See docs/metrics.md.
"""

from conduit_core.telemetry._metrics import METRICS, Metrics
from conduit_core.telemetry._tracing import (
    INSTRUMENTATION_NAME,
    AttemptFacts,
    AttemptTrace,
    attempt_trace,
    disable_tracing,
    enable_tracing,
    segment_event,
    tracing_enabled,
)

__all__ = [
    "INSTRUMENTATION_NAME",
    "METRICS",
    "AttemptFacts",
    "AttemptTrace",
    "Metrics",
    "attempt_trace",
    "disable_tracing",
    "enable_tracing",
    "segment_event",
    "tracing_enabled",
]
