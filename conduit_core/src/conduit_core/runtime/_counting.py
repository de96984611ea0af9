"""What the runtime records per attempt into the process's instruments (``telemetry``).

Counters only, from the Execution the runtime already holds: nothing here reads the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from conduit_core.model import Execution
from conduit_core.telemetry import METRICS, AttemptTrace, attempt_trace

__all__ = ["count_end", "count_start", "traced"]


def count_start(execution: Execution, now_ms: int, *, submitted_at_ms: int | None = None) -> None:
    """The executor accepted a fresh start; claim-to-start runs from the segment's claim. For a
    Work's first attempt, ``submitted_at_ms`` (the Work's creation) gives submit-to-start: how
    long it waited in the queue, admission and launch included."""
    snap = execution.snapshot
    claimed = (
        execution.segments[-1].started_at_ms if execution.segments else execution.started_at_ms
    )
    METRICS.attempt_started(snap.binding, snap.executor, (now_ms - claimed) / 1000)
    if execution.attempt == 1 and submitted_at_ms is not None:
        METRICS.work_waited(snap.binding, (now_ms - submitted_at_ms) / 1000)


def count_end(execution: Execution) -> None:
    """Count an attempt that has just ended (a parked or held one has not)."""
    if not execution.status.terminal:
        return
    snap = execution.snapshot
    ended = execution.ended_at_ms if execution.ended_at_ms is not None else execution.started_at_ms
    METRICS.attempt_finished(
        snap.binding, snap.executor, str(execution.status), (ended - execution.started_at_ms) / 1000
    )


@contextmanager
def traced(execution: Execution, kind: str) -> Iterator[AttemptTrace]:
    """The attempt's spans (no-ops unless tracing is enabled)."""
    snap = execution.snapshot
    with attempt_trace(
        execution,
        kind=kind,
        binding=snap.binding,
        executor=snap.executor,
        generation=snap.executor_generation,
    ) as trace:
        yield trace
