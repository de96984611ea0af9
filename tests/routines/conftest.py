"""Helpers for Routine tests: instants written as ISO strings, the process TZ pinned."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest


@pytest.fixture(autouse=True)
def pinned_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run every Routine test under an unusual process TZ: no result may depend on it."""
    monkeypatch.setenv("TZ", "Pacific/Chatham")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def ms(iso: str) -> int:
    """Epoch ms of an ISO-8601 date-time with an explicit offset."""
    moment = datetime.fromisoformat(iso)
    assert moment.tzinfo is not None, iso
    return round(moment.timestamp() * 1000)


def wall(when_ms: int, zone: str) -> str:
    """``when_ms`` as local ISO time with its offset in ``zone`` (to the second)."""
    return datetime.fromtimestamp(when_ms / 1000, ZoneInfo(zone)).isoformat(timespec="seconds")
