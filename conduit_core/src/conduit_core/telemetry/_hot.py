"""Counters and histograms cheap enough for every attempt and every store write.

prometheus_client's ``Histogram.observe`` costs ~2 us on this kind of machine (a lock taken per
bucket found and per sum, exemplar checks), and an attempt made five of them and two counter
increments: ~8 % of the event loop's CPU at concurrency 64. Here an observation is a bisect and
two additions under one lock, and the registry reads the counts at scrape. The exposition is
prometheus_client's own (its metric families), so ``/metrics`` reads the same, except for the
``_created`` series these families leave out.
"""

from __future__ import annotations

import itertools
import math
import threading
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["HotCounter", "HotHistogram"]


class _Count:
    """One labelled counter: its count under its lock."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount


class _Buckets:
    """One labelled histogram: how many observations fell in each bucket, and their sum."""

    __slots__ = ("_bounds", "_lock", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._lock = threading.Lock()
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        at = bisect_left(self._bounds, value)  # the first bucket whose bound is >= value
        with self._lock:
            self.counts[at] += 1
            self.total += value

    def snapshot(self) -> tuple[list[int], float]:
        with self._lock:
            return list(self.counts), self.total


class _Family(Collector):
    """Labelled children made once per label values, registered as one metric family."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], object] = {}
        registry.register(self)

    def _child(self, values: tuple[str, ...]) -> object:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name}: labels {self._labelnames}, got {values}")
            with self._lock:
                child = self._children.setdefault(values, self._make())
        return child

    def _make(self) -> object:
        raise NotImplementedError

    def collect(self) -> Iterator[Metric]:
        raise NotImplementedError


class HotCounter(_Family):
    """A counter family (exposed as ``<name>_total``)."""

    def _make(self) -> _Count:
        return _Count()

    def labels(self, *values: str) -> _Count:
        child = self._child(values)
        assert isinstance(child, _Count)
        return child

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, child in list(self._children.items()):
            assert isinstance(child, _Count)
            family.add_metric(list(values), child.value)
        yield family


class HotHistogram(_Family):
    """A histogram family with fixed bucket bounds; unlabelled, it is observed directly."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._bounds = tuple(sorted(float(b) for b in buckets if not math.isinf(b)))
        super().__init__(name, documentation, labelnames, registry)
        self._unlabelled = self.labels() if not self._labelnames else None

    def _make(self) -> _Buckets:
        return _Buckets(self._bounds)

    def labels(self, *values: str) -> _Buckets:
        child = self._child(values)
        assert isinstance(child, _Buckets)
        return child

    def observe(self, value: float) -> None:
        if self._unlabelled is None:
            raise ValueError(f"{self._name} is labelled: observe a child (labels(...))")
        self._unlabelled.observe(value)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        les = [floatToGoString(b) for b in (*self._bounds, math.inf)]  # type: ignore[no-untyped-call]
        for values, child in list(self._children.items()):
            assert isinstance(child, _Buckets)
            counts, total = child.snapshot()
            cumulative = list(itertools.accumulate(counts))
            family.add_metric(list(values), list(zip(les, cumulative, strict=True)), total)
        yield family
