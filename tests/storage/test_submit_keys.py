"""Dedup and debounce in the store, on SQLite and PostgreSQL (docs/dedup.md).

Each dedup scope's meaning (queued, active, window), the debounce push and its cap, and racing
submitters: threads on two store handles (PostgreSQL: concurrent row-locked writers) and real
processes, where exactly one Work is created and every submitter gets its id.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import anyio
import msgspec
import pytest

from conduit_core.model import ExecutionStatus, TimerKind, Work, WorkKind, WorkStatus
from conduit_core.storage import (
    AttemptEnd,
    ClaimRequest,
    DedupScope,
    Store,
    SubmitKey,
    open_store,
)
from conduit_core.storage.conformance import LEASE_MS, T0, make_input, make_work, snapshot

pytestmark = pytest.mark.anyio


def _task(work_id: str, at: int = T0) -> Work:
    w = make_work(work_id, kind=WorkKind.TASK)
    return msgspec.structs.replace(w, created_at_ms=at, updated_at_ms=at)


async def _submit(store: Store, work_id: str, key: SubmitKey, at: int = T0) -> tuple[str, bool]:
    work, deduplicated = await store.submit_keyed(
        _task(work_id, at), key, first_input=make_input(work_id), now_ms=at
    )
    return work.id, deduplicated


async def _start(store: Store, work_id: str, at: int = T0) -> None:
    claim = await store.claim_attempt(
        ClaimRequest(work_id=work_id, snapshot=snapshot()), owner="t", now_ms=at,
        lease_ms=LEASE_MS,
    )  # fmt: skip
    store._started = getattr(store, "_started", {})  # type: ignore[attr-defined]
    store._started[work_id] = claim  # type: ignore[attr-defined]


async def _finish(store: Store, work_id: str, at: int) -> None:
    claim = store._started[work_id]  # type: ignore[attr-defined]
    end = AttemptEnd(status=ExecutionStatus.COMPLETED, exclusion_confirmed=True)
    await store.finish_attempt(
        claim.lease, end, now_ms=at,
        work=lambda w: msgspec.structs.replace(w, status=WorkStatus.COMPLETED),
    )  # fmt: skip


async def test_queued_scope_ends_when_the_work_starts(store: Store) -> None:
    key = SubmitKey(key="k", scope=DedupScope.QUEUED)
    assert await _submit(store, "w1", key) == ("w1", False)
    assert await _submit(store, "w2", key) == ("w1", True)
    assert await store.pending_inputs("w1") == [await store.get_event("ev-w1")]  # w2's not kept
    await _start(store, "w1")
    assert await _submit(store, "w3", key) == ("w3", False)
    assert await _submit(store, "w4", key) == ("w3", True)


async def test_active_scope_lasts_until_the_work_ends(store: Store) -> None:
    key = SubmitKey(key="k", scope=DedupScope.ACTIVE)
    assert await _submit(store, "w1", key) == ("w1", False)
    await _start(store, "w1")
    assert await _submit(store, "w2", key) == ("w1", True)
    await _finish(store, "w1", T0 + 10)
    assert await _submit(store, "w3", key, T0 + 20) == ("w3", False)


async def test_a_cancelled_work_no_longer_holds_its_key(store: Store) -> None:
    key = SubmitKey(key="k", scope=DedupScope.QUEUED)
    await _submit(store, "w1", key)
    await store.cancel_work("w1", now_ms=T0 + 1)
    assert await _submit(store, "w2", key, T0 + 2) == ("w2", False)


async def test_window_scope_counts_from_creation_whatever_the_state(store: Store) -> None:
    key = SubmitKey(key="k", scope=DedupScope.WINDOW, window_ms=600_000)
    assert await _submit(store, "w1", key) == ("w1", False)
    await _start(store, "w1")
    await _finish(store, "w1", T0 + 10)
    assert await _submit(store, "w2", key, T0 + 599_999) == ("w1", True)  # ended, in window
    assert await _submit(store, "w3", key, T0 + 600_000) == ("w3", False)  # window over
    assert await _submit(store, "w4", key, T0 + 600_001) == ("w3", True)


async def test_keys_are_per_binding_and_per_kind(store: Store) -> None:
    key = SubmitKey(key="k")
    await _submit(store, "w1", key)
    other = msgspec.structs.replace(_task("w2"), binding="other")
    assert (await store.submit_keyed(other, key, now_ms=T0)).deduplicated is False
    debounced = SubmitKey(key="k", quiet_ms=1000)
    assert await _submit(store, "w3", debounced) == ("w3", False)


async def test_an_explicit_id_already_taken_is_refused_and_writes_nothing(store: Store) -> None:
    await store.create_work(_task("w1"), first_input=make_input("w1"))
    with pytest.raises(Exception, match="already exists") as caught:
        await _submit(store, "w1", SubmitKey(key="k"))
    assert getattr(caught.value, "code", None) == "work_exists"
    assert await _submit(store, "w2", SubmitKey(key="k")) == ("w2", False)


def _due(work: Work) -> int | None:
    return None if work.debounce is None else work.debounce.due_ms


async def test_debounce_pushes_the_start_and_keeps_every_input(store: Store) -> None:
    key = SubmitKey(key="d", quiet_ms=5_000, max_wait_ms=12_000)
    assert await _submit(store, "w1", key, T0) == ("w1", False)
    assert _due(await store.get_work("w1")) == T0 + 5_000
    assert await _submit(store, "w2", key, T0 + 4_000) == ("w1", True)
    assert await _submit(store, "w3", key, T0 + 8_000) == ("w1", True)
    work = await store.get_work("w1")
    # last + quiet = 13 s, capped by first + max_wait = 12 s
    assert _due(work) == T0 + 12_000
    assert work.pending_inputs == 3
    assert [e.payload for e in await store.pending_inputs("w1")] == [None, None, None]
    timers = await store.due_timers(now_ms=T0 + 60_000, limit=10)
    assert [(t.kind, t.due_at_ms) for t in timers] == [(TimerKind.DEBOUNCE, T0 + 12_000)]
    assert await store.ready_depth() == {}  # held: nothing to claim before the timer


async def test_without_max_wait_each_submit_pushes_the_start(store: Store) -> None:
    key = SubmitKey(key="d", quiet_ms=5_000)
    for n in range(5):
        await _submit(store, f"w{n}", key, T0 + n * 4_000)
    assert _due(await store.get_work("w0")) == T0 + 16_000 + 5_000


async def test_a_submit_after_the_release_starts_a_new_work(store: Store) -> None:
    key = SubmitKey(key="d", quiet_ms=5_000)
    await _submit(store, "w1", key, T0)
    (timer,) = await store.due_timers(now_ms=T0 + 5_000, limit=10)

    def release(work: Work) -> Work:
        return msgspec.structs.replace(work, debounce=None)

    assert await store.fire_timer(timer.id, accept=None, update_work=release, now_ms=T0 + 5_000)
    assert await store.ready_depth() == {"b": 1}
    assert await _submit(store, "w2", key, T0 + 5_001) == ("w2", False)


# --- racing submitters -----------------------------------------------------------------------

SUBMITTERS = 8


def _race_threads(url: str, submit: Callable[[Store, int], object]) -> None:
    """``SUBMITTERS`` threads, each on its own store handle, released at once."""
    gate = threading.Barrier(SUBMITTERS)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        async def main() -> None:
            store = await open_store(url)
            try:
                gate.wait()
                await submit(store, n)  # type: ignore[misc]
            finally:
                await store.aclose()

        try:
            anyio.run(main)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(SUBMITTERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors


@pytest.mark.parametrize("kind", ["dedup", "debounce"])
async def test_racing_threads_create_exactly_one_work(store_url: str, kind: str) -> None:
    key = SubmitKey(key="race") if kind == "dedup" else SubmitKey(key="race", quiet_ms=60_000)
    answers: dict[int, tuple[str, bool]] = {}

    async def submit(store: Store, n: int) -> None:
        answers[n] = await _submit(store, f"w{n}", key)

    await anyio.to_thread.run_sync(lambda: _race_threads(store_url, submit))
    store = await open_store(store_url)
    try:
        created = [w.id for w in await store.list_work(limit=100)]
        assert len(created) == 1, created
        assert {work_id for work_id, _ in answers.values()} == set(created)
        assert sorted(d for _, d in answers.values()) == [False] + [True] * (SUBMITTERS - 1)
        if kind == "debounce":  # every submit's input joined the one Work
            assert (await store.get_work(created[0])).pending_inputs == SUBMITTERS
    finally:
        await store.aclose()
