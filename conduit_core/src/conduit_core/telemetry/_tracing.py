"""OpenTelemetry traces of attempts: off unless enabled, and then only through the extra.

``conduit-core[otel]`` installs the OpenTelemetry API and SDK; nothing here imports them until
:func:`enable_tracing` is called (the daemon does when ``[settings.tracing] enabled = true``), so
a daemon without the extra, or with tracing off, pays one ``is None`` check per attempt.

Shape: one span ``conduit.attempt`` per attempt this process drives (a start, a recovery or a
resume) and, inside it, one span ``conduit.segment`` per segment (the stretch of lease-held time
at one epoch). The launch trail is recorded as events on the segment span as the runtime buffers
it: ``launch_phase.begin`` / ``launch_phase.end`` (attribute ``conduit.phase``, and
``conduit.phase_outcome``), ``invoke`` (``conduit.isolated``), ``recovery_persisted``.

Attributes are ids and names only (execution, work, epoch, attempt, binding, executor and its
generation, scope): never a run-environment value, an input payload or a binding config, which may
hold secrets.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

from conduit_core.errors import ConduitError

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = [
    "INSTRUMENTATION_NAME",
    "AttemptFacts",
    "AttemptTrace",
    "attempt_trace",
    "disable_tracing",
    "enable_tracing",
    "segment_event",
    "tracing_enabled",
]

#: The tracer's instrumentation scope name.
INSTRUMENTATION_NAME = "conduit"

_tracer: Tracer | None = None
_segment: ContextVar[Span | None] = ContextVar("conduit_segment_span", default=None)

Attr = str | int | bool


class AttemptFacts(Protocol):
    """What a span reads of an attempt (``model.Execution`` has these)."""

    @property
    def id(self) -> str: ...
    @property
    def work_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def scope(self) -> str: ...


def enable_tracing(provider: TracerProvider | None = None) -> None:
    """Trace attempts from now on, through ``provider`` (default: the global provider).

    Raises ``ConduitError`` (``tracing_unavailable``) when the ``otel`` extra is not installed.
    """
    global _tracer
    try:
        from opentelemetry import trace
    except ImportError as exc:
        raise ConduitError(
            "tracing is enabled but OpenTelemetry is not installed: pip install "
            "'conduit-core[otel]' (or set [settings.tracing] enabled = false)",
            code="tracing_unavailable",
        ) from exc
    _tracer = trace.get_tracer(INSTRUMENTATION_NAME, tracer_provider=provider)


def disable_tracing() -> None:
    global _tracer
    _tracer = None


def tracing_enabled() -> bool:
    return _tracer is not None


class AttemptTrace:
    """The open spans of one attempt; every method is a no-op when tracing is off."""

    def __init__(self, attempt: Span | None, segment: Span | None) -> None:
        self._attempt = attempt
        self._segment = segment

    def ended(
        self, status: str, *, failure_code: str | None = None, epoch: int | None = None
    ) -> None:
        """Record how the attempt left this process's hands (its status, or ``held`` …)."""
        for span in (self._segment, self._attempt):
            if span is None:
                continue
            span.set_attribute("conduit.outcome", status)
            if epoch is not None:
                span.set_attribute("conduit.epoch_end", epoch)
            if failure_code is not None:
                span.set_attribute("conduit.failure_code", failure_code)
        if self._attempt is not None and status in ("failed", "timed_out"):
            from opentelemetry.trace import Status, StatusCode

            self._attempt.set_status(Status(StatusCode.ERROR, failure_code or status))


_OFF = AttemptTrace(None, None)


@contextmanager
def attempt_trace(
    execution: AttemptFacts,
    *,
    kind: str,
    binding: str,
    executor: str,
    generation: int,
) -> Iterator[AttemptTrace]:
    """Open the attempt span and its segment span for the body (``kind``: start, recover,
    resume); launch-trail events inside the body land on the segment span."""
    tracer = _tracer
    if tracer is None:
        yield _OFF
        return
    attrs: dict[str, Attr] = {
        "conduit.execution_id": execution.id,
        "conduit.work_id": execution.work_id,
        "conduit.attempt": execution.attempt,
        "conduit.epoch": execution.epoch,
        "conduit.scope": execution.scope,
        "conduit.binding": binding,
        "conduit.executor": executor,
        "conduit.executor_generation": generation,
        "conduit.kind": kind,
    }
    with tracer.start_as_current_span("conduit.attempt", attributes=attrs) as attempt:
        seg_attrs: dict[str, Attr] = {
            "conduit.execution_id": execution.id,
            "conduit.epoch": execution.epoch,
            "conduit.kind": kind,
        }
        with tracer.start_as_current_span("conduit.segment", attributes=seg_attrs) as segment:
            token = _segment.set(segment)
            try:
                yield AttemptTrace(attempt, segment)
            finally:
                _segment.reset(token)


def segment_event(name: str, attributes: dict[str, Attr] | None = None) -> None:
    """Add an event to the current segment span, if one is open (launch phases call this)."""
    span = _segment.get()
    if span is not None:
        span.add_event(name, attributes=attributes or {})
