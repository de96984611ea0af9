"""The hot-path instruments (``telemetry/_hot.py``) expose what prometheus_client's would.

Both are fed the same observations, with values on, just under and just over bucket bounds,
from several threads at once; the two registries' text exposition must match line for line
(prometheus_client's ``_created`` series aside, which the hot families leave out).
"""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from conduit_core.telemetry._hot import HotCounter, HotHistogram

BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.1, 1, 2.5, 5)
VALUES = (0.0, 0.0004, 0.0005, 0.00051, 0.003, 0.1, 0.10001, 1, 4.9, 5, 7, 1e9)


def _exposition(registry: CollectorRegistry) -> list[str]:
    lines = generate_latest(registry).decode().splitlines()
    return [line for line in lines if "_created" not in line]


def _sums(lines: list[str]) -> dict[str, float]:
    """The ``_sum`` lines' values: threads add in any order, so they match to rounding."""
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in lines)
        if "_sum" in name
    }


def test_hot_instruments_expose_what_prometheus_client_would() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    pairs = [
        (
            Histogram("t_seconds", "labelled", ["a", "b"], buckets=BOUNDS, registry=theirs),
            HotHistogram("t_seconds", "labelled", ["a", "b"], buckets=BOUNDS, registry=ours),
        ),
    ]
    plain = (
        Histogram("u_seconds", "plain", buckets=BOUNDS, registry=theirs),
        HotHistogram("u_seconds", "plain", buckets=BOUNDS, registry=ours),
    )
    counted = (
        Counter("n", "counted", ["kind"], registry=theirs),
        HotCounter("n", "counted", ["kind"], registry=ours),
    )

    def feed(thread: int) -> None:
        for round_ in range(200):
            for value in VALUES:
                for theirs_h, ours_h in pairs:
                    theirs_h.labels("x", str(thread % 2)).observe(value)
                    ours_h.labels("x", str(thread % 2)).observe(value)
                plain[0].observe(value)
                plain[1].observe(value)
            counted[0].labels(str(round_ % 3)).inc()
            counted[1].labels(str(round_ % 3)).inc()

    threads = [threading.Thread(target=feed, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected, found = _exposition(theirs), _exposition(ours)
    assert [line for line in found if "_sum" not in line] == [
        line for line in expected if "_sum" not in line
    ]
    assert _sums(found) == pytest.approx(_sums(expected), rel=1e-12)
    assert len(_sums(found)) == 3
    assert any(line.startswith("u_seconds_count 9600.0") for line in expected)


def test_an_unlabelled_family_exposes_zero_before_any_observation() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    Histogram("w_seconds", "writes", buckets=BOUNDS, registry=theirs)
    HotHistogram("w_seconds", "writes", buckets=BOUNDS, registry=ours)
    assert _exposition(ours) == _exposition(theirs)


def test_labels_are_checked() -> None:
    family = HotHistogram(
        "v_seconds", "labelled", ["a"], buckets=BOUNDS, registry=CollectorRegistry()
    )
    with pytest.raises(ValueError, match="labels"):
        family.labels("x", "y")
    with pytest.raises(ValueError, match="labelled"):
        family.observe(1.0)
