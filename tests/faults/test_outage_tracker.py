"""The host's store-outage tracker: one line when an outage starts, one when it ends, and a
pause between passes that grows while it lasts (the spec: "reconnect with backoff, log it
clearly", not a line per failed step)."""

from __future__ import annotations

import logging

import pytest

from conduit_core.daemon._outage import StoreOutage, is_outage
from conduit_core.errors import ConduitError, StoreError


def test_one_line_per_outage_and_a_growing_pause(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    outage = StoreOutage(monotonic=lambda: now[0])  # the daemon's defaults
    lost = StoreError("store x is unreachable", code="store_unreachable")
    caplog.set_level(logging.INFO, logger="conduit.daemon")

    assert outage.pause_s(1.0) == 1.0  # store up: the normal rescan
    pauses = []
    for _ in range(8):
        outage.failed("pass step 'claim'", lost)
        pauses.append(outage.pause_s(0.2))
        now[0] += 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("store unavailable (pass step 'claim': [store_unreachable]")
    # 0.25 s doubling (±25 % jitter), never past 1 s: back at work within a second of the
    # store answering again, however long it was down.
    assert pauses[0] <= 0.25 * 1.25
    assert pauses[1] >= 0.5 * 0.75
    assert min(pauses[3:]) >= 0.75
    assert max(pauses) <= 1.0

    outage.recovered()
    outage.recovered()  # a second clean pass logs nothing more
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings[1:] == ["store available again after 8.0 s (8 failed tries)"]
    assert outage.pause_s(1.0) == 1.0
    # A second outage is a new line, and its backoff starts from the bottom again.
    outage.failed("attempt x", lost)
    assert outage.pause_s(0.2) <= 0.25 * 1.25
    assert outage.outages == 2


def test_only_unanswered_stores_count_as_an_outage() -> None:
    assert is_outage(StoreError("x", code="store_unavailable"))
    assert is_outage(StoreError("x", code="store_unreachable"))
    assert is_outage(StoreError("x", code="store_full"))
    assert not is_outage(StoreError("x", code="store_busy"))
    assert not is_outage(ConduitError("x", code="lease_lost"))
    assert not is_outage(RuntimeError("store_unreachable"))
