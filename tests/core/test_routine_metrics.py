"""Per-Routine fire counters: outcome by the Routine's grace, and a bounded label set."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from conduit_core.telemetry import Metrics
from conduit_core.telemetry._metrics import MAX_ROUTINE_LABELS, OTHER_ROUTINES


def _fires(metrics: Metrics) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for family in metrics.registry.collect():
        if family.name == "conduit_routine_fires":
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[(s.labels["routine"], s.labels["outcome"])] = s.value
    return out


def test_fires_are_fired_late_or_skipped_by_the_routines_grace() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.routine_fired(0.2, "nightly", 60.0)
    metrics.routine_fired(61.0, "nightly", 60.0)
    metrics.routine_skipped("nightly")
    metrics.routine_fired(5.0)  # a caller without the Routine: the lateness histogram only
    assert _fires(metrics) == {
        ("nightly", "fired"): 1, ("nightly", "late"): 1, ("nightly", "skipped"): 1,
    }  # fmt: skip


def test_routine_labels_are_capped_with_other() -> None:
    metrics = Metrics(CollectorRegistry())
    for n in range(MAX_ROUTINE_LABELS + 50):
        metrics.routine_fired(0.0, f"r{n}", 60.0)
        metrics.routine_misfired(f"r{n}", "skip", 1)
    fires = _fires(metrics)
    assert len(fires) == MAX_ROUTINE_LABELS + 1
    assert fires[(OTHER_ROUTINES, "fired")] == 50
    assert fires[("r0", "fired")] == 1
    metrics.routine_fired(0.0, "r0", 60.0)  # a known id keeps its own series
    assert _fires(metrics)[("r0", "fired")] == 2
    misfires = {
        s.labels["routine"]
        for family in metrics.registry.collect() if family.name == "conduit_routine_misfires"
        for s in family.samples if s.name.endswith("_total")
    }  # fmt: skip
    assert len(misfires) == MAX_ROUTINE_LABELS + 1
