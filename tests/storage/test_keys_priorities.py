"""Concurrency keys and priorities in the store's claim (issue 36), on both backends.

Keys: at most ``key_limit`` attempts of Work with one key hold a slot; a key at its limit is
not read from the ready queue, so it never keeps other keys' Work out of a claim (fairness);
a claimed attempt carries its key, and its slot stays counted until it is freed. Priorities:
a claim takes higher priority first, and a Work that waited a minute per point of difference
goes ahead of a later one of higher priority (aging). The race between processes and daemons is
tests/daemon/test_key_daemons.py's.
"""

from __future__ import annotations

import msgspec
import pytest

from conduit_core.storage import CapacityLimits, Claim, ClaimRefusal, open_store
from conduit_core.storage.conformance import T0, make_input, snapshot
from tests.storage._keyed import in_transaction, keyed_work, parked_ids

pytestmark = pytest.mark.anyio

#: Room for every Work below: only keys (or nothing) refuse.
ROOMY = CapacityLimits(global_limit=100, concurrency_keys=True)



async def _claim(store: object, limit: int, capacity: CapacityLimits = ROOMY) -> list[object]:
    return await store.claim_ready(  # type: ignore[attr-defined,no-any-return]
        limit=limit, snapshot_for=lambda work: snapshot(), owner="o", now_ms=T0 + 10,
        lease_ms=30_000, capacity=capacity,
    )  # fmt: skip


def _claimed(outcomes: list[object]) -> list[str]:
    return [c.work.id for c in outcomes if isinstance(c, Claim)]




async def test_a_key_at_its_limit_holds_its_work_back_and_not_other_keys(store_url: str) -> None:
    """Key ``a`` (limit 1) has the three oldest Work, ``b`` (limit 2) two more, then one Work
    without a key. ``a``'s second and third are parked as they are submitted (its limit filled
    by the first), so a claim of 3 takes ``a0`` and both of ``b`` without reading them; the
    next takes the keyless one, though ``a``'s two older Work are ready before it."""
    async with await open_store(store_url) as store:
        works = [
            *(keyed_work(f"a{i}", "a", at=T0 + i) for i in range(3)),
            *(keyed_work(f"b{i}", "b", 2, at=T0 + 3 + i) for i in range(2)),
            keyed_work("free", None, at=T0 + 9),
        ]
        for work in works:
            await store.create_work(work, first_input=make_input(f"{work.id}-in"))
        assert await parked_ids(store) == ["a1", "a2"]
        first = await _claim(store, 3)
        assert _claimed(first) == ["a0", "b0", "b1"]
        assert [r for r in first if isinstance(r, ClaimRefusal)] == []
        rest = await _claim(store, 10)
        claimed = {*_claimed(first), *_claimed(rest)}
        assert claimed == {"a0", "b0", "b1", "free"}, claimed
        # Nothing more starts while the holders live; the key's Work is said to wait for it.
        assert _claimed(await _claim(store, 10)) == []
        waiting = await store.capacity_refusal(ROOMY, await store.get_work("a1"))
        assert waiting is not None
        assert waiting.code == "concurrency_key"
        assert "waiting for key 'a' (1 of 1 attempts live)" in waiting.message
        attempt = await store.get_execution("a0#1")
        assert attempt.concurrency_key == "a"


async def test_a_key_limit_holds_without_the_fairness_filter(store_url: str) -> None:
    """The ready read's filter and the parking are only fairness: with the filter off (no
    binding declares a key) and the parked Work unparked by hand, the claim's own count still
    refuses more attempts of a key than its limit."""
    plain = CapacityLimits(global_limit=100)
    async with await open_store(store_url) as store:
        for i in range(4):
            work = keyed_work(f"a{i}", "a", 2, at=T0 + i)
            await store.create_work(work, first_input=make_input(f"{work.id}-in"))
        assert await parked_ids(store) == ["a2", "a3"]
        await in_transaction(store, lambda cx: cx.run("UPDATE conduit_work SET key_parked = 0"))
        outcomes = await _claim(store, 10, plain)
        assert _claimed(outcomes) == ["a0", "a1"]
        refused = [r for r in outcomes if isinstance(r, ClaimRefusal)]
        assert {r.work_id for r in refused} == {"a2", "a3"}
        assert all(r.code == "concurrency_key" and r.limit_name == "key:a" for r in refused)
        assert all("waiting for key 'a' (2 of 2 attempts live)" in r.message for r in refused)
        assert _claimed(await _claim(store, 10, plain)) == []


async def test_a_claim_by_id_checks_the_key_too(store_url: str) -> None:
    from conduit_core.storage import ClaimRequest

    async with await open_store(store_url) as store:
        for i in range(2):
            work = keyed_work(f"a{i}", "a")
            await store.create_work(work, first_input=make_input(f"{work.id}-in"))
        outcomes = await store.claim_attempts(
            [ClaimRequest(work_id=w, snapshot=snapshot()) for w in ("a0", "a1")],
            owner="o", now_ms=T0, lease_ms=30_000, capacity=ROOMY,
        )  # fmt: skip
        assert isinstance(outcomes[0], Claim)
        assert isinstance(outcomes[1], ClaimRefusal)
        assert outcomes[1].code == "concurrency_key"


async def test_higher_priority_first_and_aging_lets_low_priority_through(store_url: str) -> None:
    """``hi`` (priority 5) was ready a minute after ``lo`` (0): it goes first. ``old`` (-5) was
    ready six minutes before ``hi``: five points are five minutes, so it goes before ``hi``."""
    minute = 60_000
    async with await open_store(store_url) as store:
        works = [
            keyed_work("lo", None, at=T0, priority=0),
            keyed_work("hi", None, at=T0 + minute, priority=5),
            keyed_work("old", None, at=T0 - 5 * minute, priority=-5),
            keyed_work("older", None, at=T0 - 6 * minute, priority=-5),
        ]
        for work in works:
            await store.create_work(work, first_input=make_input(f"{work.id}-in"))
        order = []
        for _ in works:
            order += _claimed(await _claim(store, 1))
        # older: T0 - 6 min + 5 min = T0 - 1 min; hi: T0 + 1 min - 5 min = T0 - 4 min;
        # old: T0 - 5 min + 5 min = T0; lo: T0 (id order breaks the tie: "lo" < "old").
        assert order == ["hi", "older", "lo", "old"]


async def test_a_parked_attempt_resumes_only_when_its_key_has_room(store_url: str) -> None:
    """A parked attempt holds no slot, so another Work of its key may start meanwhile; its
    resume is then refused for the key (a capacity refusal: the wait stays) until that ends."""
    from conduit_core.errors import CapacityError
    from conduit_core.model import ExecutionStatus, Wait, WorkStatus
    from conduit_core.storage import AttemptEnd

    async with await open_store(store_url) as store:
        for i in range(2):
            work = keyed_work(f"a{i}", "a", at=T0 + i)
            await store.create_work(work, first_input=make_input(f"{work.id}-in"))
        (first,) = [c for c in await _claim(store, 10) if isinstance(c, Claim)]
        wait = Wait(execution_id=first.execution.id, work_id=first.work.id, event_type="go",
                    created_at_ms=T0)  # fmt: skip
        await store.finish_attempt(
            first.lease, AttemptEnd(status=ExecutionStatus.PARKED, remaining_budget_ms=500),
            now_ms=T0 + 20, work=lambda w: msgspec.structs.replace(w, status=WorkStatus.WAITING),
            wait=wait,
        )  # fmt: skip
        assert _claimed(await _claim(store, 10)) == ["a1"]  # the key's slot was free
        with pytest.raises(CapacityError) as refused:
            await store.resume_attempt(first.execution.id, owner="o", now_ms=T0 + 30,
                                       lease_ms=30_000, wake_event_id="e", capacity=ROOMY)  # fmt: skip
        assert refused.value.code == "concurrency_key"
        assert await store.matching_waits(event_type="go", correlation_key=None) == [wait]
