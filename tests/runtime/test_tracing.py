"""OpenTelemetry spans of attempts, through a real scheduler run on a real store.

The SDK's in-memory exporter collects what a run emits; with tracing off (the default) a run
emits nothing at all.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from conduit_core.config import TracingSettings
from conduit_core.daemon import check_tracing
from conduit_core.errors import ConduitError
from conduit_core.model import Execution, ExecutionStatus
from conduit_core.runtime import Scheduler
from conduit_core.telemetry import disable_tracing, enable_tracing, tracing_enabled

from .conftest import submit

pytestmark = pytest.mark.anyio


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    enable_tracing(provider)
    try:
        yield exporter
    finally:
        disable_tracing()
        provider.shutdown()


async def run(sched: Scheduler, work_id: str) -> Execution:
    return await sched.run_attempt(await sched.claim(work_id))


def by_name(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def test_an_attempt_and_its_segment_are_spans_with_the_launch_trail_as_events(
    scheduler: Scheduler, spans: InMemorySpanExporter
) -> None:
    work = await submit(scheduler, "job", {"launch_seconds": 0})
    ended = await run(scheduler, work.id)
    assert ended.status is ExecutionStatus.COMPLETED

    (attempt,) = by_name(spans, "conduit.attempt")
    (segment,) = by_name(spans, "conduit.segment")
    attrs = dict(attempt.attributes or {})
    assert attrs["conduit.execution_id"] == ended.id
    assert attrs["conduit.work_id"] == work.id
    assert attrs["conduit.epoch"] == ended.epoch == 1
    assert attrs["conduit.attempt"] == 1
    assert attrs["conduit.binding"] == "job"
    assert attrs["conduit.executor"] == "scripted-job"
    assert attrs["conduit.executor_generation"] == ended.snapshot.executor_generation
    assert attrs["conduit.kind"] == "start"
    assert attrs["conduit.outcome"] == "completed"
    # The segment is the attempt's child, in the same trace.
    assert segment.parent is not None
    assert attempt.context is not None
    assert segment.context is not None
    assert segment.parent.span_id == attempt.context.span_id
    assert segment.context.trace_id == attempt.context.trace_id
    assert dict(segment.attributes or {})["conduit.epoch"] == 1
    # The launch trail, in the order it happened, as the store recorded it.
    events = [(e.name, dict(e.attributes or {}).get("conduit.phase")) for e in segment.events]
    assert events == [
        ("launch_phase.begin", "environment"),
        ("launch_phase.end", "environment"),
        ("invoke", None),
        ("launch_phase.begin", "executor"),
        ("launch_phase.begin", "container_create"),
        ("launch_phase.end", "container_create"),
        ("recovery_persisted", None),
        ("launch_phase.end", "executor"),
    ]
    stored = [p.name for p in ended.segments[-1].launch]
    assert stored == ["environment", "executor", "container_create"]
    invoke = next(e for e in segment.events if e.name == "invoke")
    assert dict(invoke.attributes or {}) == {"conduit.isolated": True}


async def test_a_failed_attempt_sets_the_error_status(
    scheduler: Scheduler, spans: InMemorySpanExporter
) -> None:
    work = await submit(scheduler, payload={"outcome": "failed"})
    ended = await run(scheduler, work.id)
    assert ended.status is ExecutionStatus.FAILED
    (attempt,) = by_name(spans, "conduit.attempt")
    assert attempt.status.status_code is StatusCode.ERROR
    assert dict(attempt.attributes or {})["conduit.outcome"] == "failed"


async def test_run_environment_values_never_reach_a_span(
    scheduler: Scheduler, spans: InMemorySpanExporter
) -> None:
    work = await submit(scheduler, "env", {"secret_input": "payload-secret"})
    ended = await run(scheduler, work.id)
    assert ended.status is ExecutionStatus.COMPLETED
    exported = [json.loads(s.to_json()) for s in spans.get_finished_spans()]
    text = json.dumps(exported)
    assert ended.id in text  # the search below does look at the attributes
    # The test plugin gives scope test-env CONDUIT_TEST_ENV=from-test-plugin; the payload is
    # the Work's input. Neither is an attribute or an event of any span.
    assert "from-test-plugin" not in text
    assert "CONDUIT_TEST_ENV" not in text
    assert "payload-secret" not in text


async def test_tracing_is_off_by_default_and_emits_nothing(scheduler: Scheduler) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert not tracing_enabled()  # off unless a daemon's config (or a caller) turns it on
    enable_tracing(provider)
    disable_tracing()
    work = await submit(scheduler)
    assert (await run(scheduler, work.id)).status is ExecutionStatus.COMPLETED
    assert exporter.get_finished_spans() == ()
    provider.shutdown()


def test_tracing_on_without_the_extra_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    check_tracing(TracingSettings(enabled=True))  # installed here: accepted
    check_tracing(TracingSettings(enabled=False))
    # A None entry makes the import fail exactly as a missing package does.
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    check_tracing(TracingSettings(enabled=False))  # off: nothing to install
    with pytest.raises(ConduitError) as refused:
        check_tracing(TracingSettings(enabled=True))
    assert refused.value.code == "tracing_unavailable"
    assert "$.settings.tracing.enabled" in refused.value.message
    assert "conduit-core[otel]" in refused.value.message
