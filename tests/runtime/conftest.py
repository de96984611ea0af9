"""Scheduler fixtures: a store on each backend, a controllable clock, the real plugins."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

from conduit_core.config import Binding
from conduit_core.model import Event, Work, WorkKind
from conduit_core.plugins import Plugins
from conduit_core.runtime import ManualClock, Scheduler, SchedulerOptions
from conduit_core.storage import Store, open_store
from conduit_test_plugin import plugin as test_plugin
from conduit_test_plugin import scripted
from tests.storage.conftest import postgres_url, sqlite_url, store_url  # noqa: F401

pytestmark = pytest.mark.anyio

BINDINGS = {
    "agent": Binding(executor="scripted", retry_delays_seconds=[300, 600]),
    "job": Binding(executor="scripted-job", retry_delays_seconds=[300, 600]),
    "job-team": Binding(executor="scripted-job", scope="team-a"),
    "agent-team": Binding(executor="scripted", scope="team-b"),
    "terminal": Binding(executor="scripted", terminal_on_exhaustion=True, retry_delays_seconds=[1]),
    "quick": Binding(executor="scripted", timeout_seconds=0.3),
    "env": Binding(executor="scripted", scope="test-env"),
}


@pytest.fixture(autouse=True)
def _reset_scripted() -> None:
    scripted.reset()


@pytest.fixture(autouse=True)
def _reset_gate_calls() -> None:
    test_plugin.GATE_CALLS.clear()
    test_plugin.ON_ASK.clear()


def gate_calls(work_id: str) -> list[str]:
    """The test plugin's start gates asked about ``work_id``, in order."""
    return [gate for gate, wid in test_plugin.GATE_CALLS if wid == work_id]


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:  # noqa: F811
    async with await open_store(store_url) as opened:
        yield opened


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="session")
def plugins() -> Plugins:
    return Plugins.load(disabled=())


def options(**overrides: Any) -> SchedulerOptions:
    base: dict[str, Any] = {
        "owner": "test-host",
        "bindings": BINDINGS,
        "scope_parents": {"team-a": "root", "team-b": "root", "test-env": "root"},
    }
    base.update(overrides)
    return SchedulerOptions(**base)


@pytest.fixture
def make_scheduler(store: Store, clock: ManualClock, plugins: Plugins) -> Callable[..., Scheduler]:
    def make(*, store_: Store | None = None, clock_: Any = None, **overrides: Any) -> Scheduler:
        return Scheduler(store_ or store, clock_ or clock, plugins, options(**overrides))

    return make


@pytest.fixture
def scheduler(make_scheduler: Callable[..., Scheduler]) -> Scheduler:
    return make_scheduler()


_counter = {"n": 0}


async def submit(
    sched: Scheduler,
    binding: str = "agent",
    payload: Any = None,
    *,
    kind: WorkKind = WorkKind.TASK,
    work_id: str | None = None,
    keys: list[str] | None = None,
) -> Work:
    _counter["n"] += 1
    # Zero-padded: Work ready in the same millisecond is claimed in id order, and "w10" would
    # sort before "w9".
    wid = work_id or f"w{_counter['n']:06d}"
    now = sched.clock.now_ms()
    scope = sched.options.bindings[binding].scope
    work = Work(
        id=wid, scope=scope, binding=binding, kind=kind, created_at_ms=now, updated_at_ms=now,
        correlation_keys=keys or [],
    )  # fmt: skip
    first = Event(
        id=f"{wid}/in1", delivery_id=f"{wid}/in1", type="input", payload=payload or {},
        work_id=wid, pending=True, accepted_at_ms=now,
    )  # fmt: skip
    return await sched.submit(work, first)


def input_event(work_id: str, n: int, payload: Any = None, **fields: Any) -> Event:
    return Event(
        id=f"{work_id}/in{n}", delivery_id=f"{work_id}/in{n}", type=fields.pop("type", "input"),
        payload=payload or {}, work_id=work_id, pending=True, accepted_at_ms=0, **fields,
    )  # fmt: skip


async def eventually(check: Callable[[], Awaitable[bool]], *, within: float = 10.0) -> None:
    """Poll ``check`` until it holds, failing after ``within`` seconds (never sleep-and-hope)."""
    with anyio.fail_after(within):
        while not await check():  # noqa: ASYNC110 - a condition in storage, polled with a deadline
            await anyio.sleep(0.01)
