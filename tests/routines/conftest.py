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


# --- Store-backed fixtures (every case runs on SQLite and PostgreSQL) ---------------------------

from collections.abc import AsyncIterator  # noqa: E402
from typing import Any  # noqa: E402

from conduit_core.model import Event, Work, WorkStatus  # noqa: E402
from conduit_core.routines.managed import ConduitRoutineSource  # noqa: E402
from conduit_core.runtime import ManualClock  # noqa: E402
from conduit_core.storage import Claim, Store, open_store  # noqa: E402
from tests.storage.conftest import postgres_url, sqlite_url, store_url  # noqa: E402, F401

T0 = ms("2026-03-02T10:00:00+00:00")  # a Monday; every store test starts here
BINDINGS = {"echo": "root", "team-job": "team-a"}
SCOPES = {"root", "team-a"}


class StoreTarget:
    """A fire target that writes straight to the store (the Scheduler's submit, minus plugins).

    ``block`` holds submits of a Work id prefix until released (a slow fire). Like the
    Scheduler it submits many at once (the ticker's batched fires) unless ``batch`` is false
    (then every fire goes one by one, as with a target that cannot batch).
    """

    def __init__(self, store: Store, *, batch: bool = True) -> None:
        self.store = store
        self.submitted: list[str] = []
        self.block: dict[str, Any] = {}
        self.batches: list[int] = []
        if batch:
            self.submit_many = self._submit_many

    async def _submit_many(self, items: list[tuple[Work, Event | None]]) -> list[Any]:
        self.batches.append(len(items))
        self.submitted += [work.id for work, _ in items]
        return await self.store.create_works(items)

    async def submit(self, work: Work, first_input: Event | None = None) -> Work:
        for prefix, gate in self.block.items():
            if work.id.startswith(prefix):
                await gate.wait()
        self.submitted.append(work.id)
        return await self.store.create_work(work, first_input=first_input)

    async def accept_input(self, event: Event) -> tuple[Event, list[Claim]]:
        return await self.store.accept_event(event), []


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:  # noqa: F811
    async with await open_store(store_url) as opened:
        yield opened


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def source(store: Store, clock: ManualClock) -> ConduitRoutineSource:
    return ConduitRoutineSource(store, clock, bindings=BINDINGS, scopes=SCOPES)


async def finish_work(store: Store, work_id: str, status: WorkStatus, now_ms: int) -> Work:
    """End a fired Work as an attempt would (the runtime's own tests cover attempts)."""
    import msgspec

    return await store.update_work(
        work_id, lambda w: msgspec.structs.replace(w, status=status), now_ms=now_ms
    )


async def eventually(check: Any, *, within: float = 10.0) -> None:
    """Poll the async ``check`` until it holds, failing after ``within`` seconds."""
    import anyio

    with anyio.fail_after(within):
        while not await check():  # noqa: ASYNC110 - a condition in storage, polled with a deadline
            await anyio.sleep(0.01)
