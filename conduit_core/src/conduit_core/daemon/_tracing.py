"""Turning ``[settings.tracing]`` into a tracer provider (``conduit-core[otel]``)."""

from __future__ import annotations

from collections.abc import Callable

from conduit_core.config import TracingSettings
from conduit_core.errors import ConduitError
from conduit_core.telemetry import enable_tracing

__all__ = ["check_tracing", "start_tracing"]

_MISSING = (
    "$.settings.tracing.enabled: tracing is on but the OpenTelemetry SDK is not installed: "
    "pip install 'conduit-core[otel]'"
)


def check_tracing(settings: TracingSettings) -> None:
    """Refuse (``tracing_unavailable``) tracing that is on without the ``otel`` extra."""
    if not settings.enabled:
        return
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise ConduitError(_MISSING, code="tracing_unavailable") from exc


def start_tracing(settings: TracingSettings) -> Callable[[], None] | None:
    """Enable attempt traces as configured; returns the provider's shutdown (flushes spans)."""
    if not settings.enabled:
        return None
    check_tracing(settings)
    if settings.exporter == "global":
        enable_tracing()
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    if settings.exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConduitError(_MISSING, code="tracing_unavailable") from exc
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    enable_tracing(provider)
    return provider.shutdown
