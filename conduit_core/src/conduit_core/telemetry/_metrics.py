"""The daemon's hot-path instruments: counters and histograms, nothing that reads the store.

One :class:`Metrics` per process (:data:`METRICS`), on its own ``CollectorRegistry`` rather than
prometheus_client's global one, so importing conduit never adds series to an embedding
application's registry and a test can read exactly conduit's. Gauges that mirror stored state
(capacity, ready Work, holds) are not here: the ``/metrics`` endpoint computes them from the
store at scrape (see ``http/_metrics.py``), so they always match what the API says.

Every method is a dictionary look-up and an increment under a lock: cheap enough to call on every
attempt, renewal and store write. The per-attempt and per-write instruments are ``_hot``'s (an
observation ~0.5 us against prometheus_client's ~2 us); they keep their labelled children (one
per binding, executor and outcome: bounded by the configuration), so an attempt does not pay for
label validation and look-up.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.process_collector import ProcessCollector

from conduit_core.telemetry._hot import HotCounter, HotHistogram

__all__ = ["MAX_ROUTINE_LABELS", "METRICS", "Metrics", "OTHER_ROUTINES"]

#: Distinct Routine ids the per-Routine series name, per process; later ones share
#: :data:`OTHER_ROUTINES`, so a store with thousands of Routines cannot flood a scraper.
MAX_ROUTINE_LABELS = 100
OTHER_ROUTINES = "other"

#: Attempt durations run from seconds to hours (the default timeout is one hour).
_DURATION_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)
#: Claim-to-start is the admission, environment and launch path: milliseconds to seconds.
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: Submit-to-start is the queue wait: milliseconds when idle, minutes behind a backlog.
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
#: A Routine fires within its grace (60 s by default) unless the daemon was down for longer.
_LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 86400)
#: Store writes: a local SQLite commit is sub-millisecond, a remote PostgreSQL one milliseconds.
_WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
#: Operations per group-commit batch (GroupCommit caps a batch at 128).
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """The instruments; each ``record_*`` / ``*_inc`` method is safe from any thread."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.attempts_started = HotCounter(
            "conduit_attempts_started",
            "Attempts whose executor accepted the launch (fresh starts; relaunches are counted "
            "by conduit_recoveries_total)",
            ["binding", "executor"],
            registry=r,
        )
        self.attempts_finished = HotCounter(
            "conduit_attempts_finished",
            "Attempts that ended, by outcome (the attempt's final status)",
            ["binding", "executor", "outcome"],
            registry=r,
        )
        self.attempt_duration = HotHistogram(
            "conduit_attempt_duration_seconds",
            "From an attempt's claim to its end, recoveries included",
            ["binding", "executor", "outcome"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.claim_to_start = HotHistogram(
            "conduit_attempt_claim_to_start_seconds",
            "From an attempt's claim to its executor accepting the launch",
            ["binding", "executor"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.submit_to_start = HotHistogram(
            "conduit_work_submit_to_start_seconds",
            "From a Work's submit to its first attempt's start (queue wait, admission, launch)",
            ["binding"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.lease_renewals = Counter(
            "conduit_lease_renewals", "Lease renewals the store accepted", registry=r
        )
        self.lease_losses = Counter(
            "conduit_lease_losses",
            "Leases lost while their attempt ran (a renewal refused: another owner or expiry)",
            registry=r,
        )
        self.recoveries = Counter(
            "conduit_recoveries",
            "Recovery decisions: adopted, relaunched, held, resources_gone",
            ["result"],
            registry=r,
        )
        self.routine_lateness = Histogram(
            "conduit_routine_fire_lateness_seconds",
            "How long after its scheduled occurrence a Routine fired",
            buckets=_LATENESS_BUCKETS,
            registry=r,
        )
        self.routine_misfires = Counter(
            "conduit_routine_misfires",
            "Routine occurrences that never fired (skipped or coalesced into a later fire); "
            f"past {MAX_ROUTINE_LABELS} Routines, routine=\"{OTHER_ROUTINES}\"",
            ["routine", "policy"],
            registry=r,
        )
        self.routine_fires = Counter(
            "conduit_routine_fires",
            "Routine fire decisions: fired (within its grace), late (fired past its grace), "
            f"skipped (not fired, by its misfire policy); past {MAX_ROUTINE_LABELS} Routines, "
            f"routine=\"{OTHER_ROUTINES}\"",
            ["routine", "outcome"],
            registry=r,
        )
        self._routine_labels: set[str] = set()
        self.store_write_latency = HotHistogram(
            "conduit_store_write_seconds",
            "From a write's submission to its commit (queueing for the batch included)",
            buckets=_WRITE_BUCKETS,
            registry=r,
        )
        self.store_batch_time = HotHistogram(
            "conduit_store_write_batch_seconds",
            "How long one group-commit transaction ran in its store thread, from its first "
            "statement to its commit (reruns included, queueing not)",
            buckets=_WRITE_BUCKETS,
            registry=r,
        )
        self.store_batch_size = HotHistogram(
            "conduit_store_write_batch_size",
            "Writes committed together in one group-commit transaction",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.store_retries = Counter(
            "conduit_store_retries",
            "Store transactions rolled back and run again: deadlock, serialization, "
            "unique_violation, statement_dropped (PostgreSQL), busy (SQLite)",
            ["reason"],
            registry=r,
        )
        ProcessCollector(namespace="conduit", registry=r)
        #: Labelled children by label values: (counter child, histogram child).
        self._started: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self._finished: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self._waited: dict[str, Any] = {}

    def attempt_started(self, binding: str, executor: str, claim_to_start_s: float) -> None:
        started, latency = _children(
            self._started, (binding, executor), self.attempts_started, self.claim_to_start
        )
        started.inc()
        latency.observe(max(claim_to_start_s, 0.0))

    def work_waited(self, binding: str, seconds: float) -> None:
        child = self._waited.get(binding)
        if child is None:
            child = self._waited[binding] = self.submit_to_start.labels(binding)
        child.observe(max(seconds, 0.0))

    def attempt_finished(
        self, binding: str, executor: str, outcome: str, duration_s: float
    ) -> None:
        finished, duration = _children(
            self._finished, (binding, executor, outcome), self.attempts_finished,
            self.attempt_duration,
        )  # fmt: skip
        finished.inc()
        duration.observe(max(duration_s, 0.0))

    def recovery(self, result: str) -> None:
        self.recoveries.labels(result).inc()

    def routine_label(self, routine: str) -> str:
        """The ``routine`` label of a Routine id: itself for the first
        :data:`MAX_ROUTINE_LABELS` ids seen, :data:`OTHER_ROUTINES` after."""
        labels = self._routine_labels
        if routine in labels:
            return routine
        if len(labels) >= MAX_ROUTINE_LABELS:
            return OTHER_ROUTINES
        labels.add(routine)
        return routine

    def routine_fired(
        self, lateness_s: float, routine: str | None = None, grace_s: float | None = None
    ) -> None:
        self.routine_lateness.observe(max(lateness_s, 0.0))
        if routine is not None:
            late = grace_s is not None and lateness_s > grace_s
            outcome = "late" if late else "fired"
            self.routine_fires.labels(self.routine_label(routine), outcome).inc()

    def routine_skipped(self, routine: str) -> None:
        self.routine_fires.labels(self.routine_label(routine), "skipped").inc()

    def routine_misfired(self, routine: str, policy: str, occurrences: int) -> None:
        if occurrences > 0:
            self.routine_misfires.labels(self.routine_label(routine), policy).inc(occurrences)

    def store_batch(self, size: int) -> None:
        self.store_batch_size.observe(size)

    def store_batch_ran(self, seconds: float) -> None:
        self.store_batch_time.observe(seconds)

    def store_write(self, seconds: float) -> None:
        self.store_write_latency.observe(seconds)

    def store_retry(self, reason: str) -> None:
        self.store_retries.labels(reason).inc()


def _children(
    cache: dict[tuple[str, ...], tuple[Any, Any]],
    key: tuple[str, ...],
    counter: HotCounter,
    histogram: HotHistogram,
) -> tuple[Any, Any]:
    """The counter's and the histogram's children for these label values, made once."""
    children = cache.get(key)
    if children is None:
        children = cache[key] = (counter.labels(*key), histogram.labels(*key))
    return children


#: The process's instruments (a daemon is one process; tests read this registry).
METRICS = Metrics()
