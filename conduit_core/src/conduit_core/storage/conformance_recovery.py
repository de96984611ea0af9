"""Storage conformance, continued: held recoveries and confirmed stops (invariant 6a).

Run beside :mod:`conduit_core.storage.conformance` (it provides the ``store`` fixture)::

    from conduit_core.storage.conformance import *  # noqa: F403
    from conduit_core.storage.conformance_recovery import *  # noqa: F403
"""

from __future__ import annotations

import anyio
import msgspec
import pytest

from conduit_core.errors import ConduitError, LeaseLostError
from conduit_core.model import (
    Execution,
    ExecutionStatus,
    RecoveryHold,
    Work,
    WorkStatus,
)
from conduit_core.storage._contract import (
    AttemptEnd,
    CapacityLimits,
    Claim,
    ClaimRequest,
    NotEligibleError,
    RecoveryRefusal,
    Settlement,
    Store,
)
from conduit_core.storage.conformance import (
    LEASE_MS,
    T0,
    StoreFactory,
    _claim,
    _complete,
    _feed,
    make_input,
    make_work,
    snapshot,
)

__all__ = [
    "test_claim_recoveries_claims_each_as_claim_recovery_would_and_refuses_the_rest",
    "test_claim_recoveries_racing_claim_each_attempt_once",
    "test_renew_leases_renews_the_held_ones_and_leaves_out_the_lost",
    "test_a_dead_owners_leases_are_released_at_once_and_only_its_own",
    "test_a_held_recovery_keeps_its_epoch_and_slot_and_blocks_its_work",
    "test_a_person_confirms_a_held_attempt_for_its_epoch_only",
    "test_an_unconfirmed_ended_attempt_blocks_the_next_claim",
]

pytestmark = pytest.mark.anyio


def _hold(epoch: int, retry_at_ms: int) -> RecoveryHold:
    return RecoveryHold(
        code="cannot_tell", message="m", epoch=epoch, since_ms=T0, retry_at_ms=retry_at_ms
    )


async def _held(store: Store, retry_at_ms: int) -> Execution:
    """Work ``w``'s attempt, lost, claimed for recovery (epoch 2) and held."""
    await store.create_work(make_work("w"))
    claim = await _claim(store, "w")
    at = T0 + LEASE_MS
    recovery = await store.claim_recovery(
        claim.execution.id, owner="b", now_ms=at, lease_ms=LEASE_MS
    )
    return await store.hold_recovery(recovery.lease, _hold(2, retry_at_ms), now_ms=at)


async def test_a_held_recovery_keeps_its_epoch_and_slot_and_blocks_its_work(
    store: Store,
) -> None:
    at = T0 + LEASE_MS
    held = await _held(store, retry_at_ms=at + 1000)
    assert held.status is ExecutionStatus.RECOVERING
    assert held.recovery_hold == _hold(2, at + 1000)
    assert [e.id for e in await store.held_recoveries()] == [held.id]
    # Its slot stays counted and its Work cannot start another attempt.
    await store.create_work(make_work("other"), first_input=make_input("other"))
    with pytest.raises(ConduitError) as full:
        await store.claim_attempt(
            ClaimRequest(work_id="other", snapshot=snapshot()),
            owner="t", now_ms=at, lease_ms=LEASE_MS, capacity=CapacityLimits(global_limit=1),
        )  # fmt: skip
    assert full.value.code == "capacity_concurrency"
    # Tried again only from retry_at_ms, at the same epoch and segment, under a new token.
    assert await store.expired_attempts(now_ms=at + 999) == []
    assert [e.id for e in await store.expired_attempts(now_ms=at + 1000)] == [held.id]
    again = await store.claim_recovery(held.id, owner="c", now_ms=at + 1000, lease_ms=LEASE_MS)
    assert again.execution.epoch == again.lease.epoch == 2
    assert len(again.execution.segments) == len(held.segments)
    assert again.execution.recovery_hold is not None
    with pytest.raises(NotEligibleError):  # being tried: its lease is live
        await store.claim_recovery(held.id, owner="d", now_ms=at + 1001, lease_ms=LEASE_MS)
    # Adopted: the hold clears and the attempt runs on.
    adopted = await store.update_attempt(
        again.lease,
        lambda ex: msgspec.structs.replace(ex, status=ExecutionStatus.RUNNING, recovery_hold=None),
        now_ms=at + 1002,
    )
    assert adopted.recovery_hold is None
    assert await store.held_recoveries() == []


def _failed(ex: Execution, work: Work) -> Settlement:
    return Settlement(
        end=AttemptEnd(
            status=ExecutionStatus.FAILED, failure_code="stop_confirmed", exclusion_confirmed=True
        ),
        work=lambda w: msgspec.structs.replace(w, status=WorkStatus.READY),
    )


async def test_a_person_confirms_a_held_attempt_for_its_epoch_only(store: Store) -> None:
    at = T0 + LEASE_MS
    held = await _held(store, retry_at_ms=at + 1000)
    with pytest.raises(ConduitError) as wrong:
        await store.confirm_stopped(held.id, 1, now_ms=at + 1, by="me", settle=_failed)
    assert wrong.value.code == "epoch_mismatch"
    assert (await store.get_execution(held.id)).status is ExecutionStatus.RECOVERING
    done = await store.confirm_stopped(
        held.id, 2, now_ms=at + 2, by="me", reason="rebooted", settle=_failed
    )
    assert (done.status, done.failure_code) == (ExecutionStatus.FAILED, "stop_confirmed")
    assert done.exclusion_confirmed
    assert done.recovery_hold is None
    assert await store.get_lease(held.id) is None
    (audit,) = [
        e for e in await store.work_events("w") if e.type == "core.execution.stop_confirmed"
    ]
    assert audit.payload["by"] == "me"
    assert audit.payload["reason"] == "rebooted"
    assert (audit.payload["epoch"], audit.payload["held"]) == (2, "cannot_tell")
    assert not audit.pending  # history, never input
    assert (await _claim(store, "w", at + 3)).execution.attempt == 2


async def test_an_unconfirmed_ended_attempt_blocks_the_next_claim(store: Store) -> None:
    await store.create_work(make_work("w"))
    claim = await _claim(store, "w")
    end = AttemptEnd(status=ExecutionStatus.TIMED_OUT, exclusion_confirmed=False)
    await store.finish_attempt(
        claim.lease, end, now_ms=T0 + 1,
        work=lambda w: msgspec.structs.replace(w, status=WorkStatus.READY),
    )  # fmt: skip
    assert (await store.get_work("w")).status is WorkStatus.READY
    assert await store.ready_work(limit=10) == []
    with pytest.raises(NotEligibleError):
        await _claim(store, "w", T0 + 2)
    await store.create_work(make_work("x"))
    running = await _claim(store, "x", T0 + 2)
    with pytest.raises(ConduitError) as live:  # a person cannot confirm a running attempt
        await store.confirm_stopped(running.execution.id, 1, now_ms=T0 + 3, by="me")
    assert live.value.code == "not_held"
    with pytest.raises(LeaseLostError):  # the host's own confirmation still names its epoch
        await store.confirm_stopped(claim.execution.id, 2, now_ms=T0 + 3)
    await store.confirm_stopped(claim.execution.id, 1, now_ms=T0 + 3)
    assert [w.id for w in await store.ready_work(limit=10)] == ["w"]
    assert (await _claim(store, "w", T0 + 4)).execution.attempt == 2


async def test_a_dead_owners_leases_are_released_at_once_and_only_its_own(store: Store) -> None:
    """``release_leases_of``: a host that knows an owner is dead recovers its attempts without
    waiting for their expiry; another owner's lease still waits for its own (negative control)."""
    claims = {}
    for name, owner in (("a1", "dead"), ("a2", "dead"), ("b1", "alive")):
        await store.create_work(make_work(name))
        await _feed(store, name)
        claims[name] = await store.claim_attempt(
            ClaimRequest(work_id=name, snapshot=snapshot()),
            owner=owner,
            now_ms=T0,
            lease_ms=LEASE_MS,
        )
    now = T0 + 1  # every lease runs until T0 + LEASE_MS
    assert await store.expired_attempts(now_ms=now) == []
    assert await store.release_leases_of("dead", now_ms=now) == 2
    assert await store.release_leases_of("dead", now_ms=now) == 0  # nothing left to release
    expired = {e.id for e in await store.expired_attempts(now_ms=now)}
    assert expired == {claims["a1"].execution.id, claims["a2"].execution.id}
    # The dead owner is fenced out of every write from now on.
    with pytest.raises(LeaseLostError):
        await store.renew_lease(claims["a1"].lease, now_ms=now)
    # Its attempts are recovered at once, at the next epoch, by the new owner.
    heir = await store.claim_recovery(
        claims["a1"].execution.id, owner="heir", now_ms=now, lease_ms=LEASE_MS
    )
    assert heir.execution.epoch == claims["a1"].execution.epoch + 1
    # The live owner's attempt is not recoverable before its lease expires.
    with pytest.raises(NotEligibleError):
        await store.claim_recovery(
            claims["b1"].execution.id, owner="heir", now_ms=now, lease_ms=LEASE_MS
        )
    assert await store.renew_lease(claims["b1"].lease, now_ms=now)


async def test_renew_leases_renews_the_held_ones_and_leaves_out_the_lost(store: Store) -> None:
    """``renew_leases`` keeps ``renew_lease``'s fence lease by lease, in one call."""
    claims = {}
    for name in ("held", "late", "released", "superseded"):
        await store.create_work(make_work(name))
        await _feed(store, name)
        claims[name] = await store.claim_attempt(
            ClaimRequest(work_id=name, snapshot=snapshot()),
            owner="a",
            now_ms=T0,
            lease_ms=LEASE_MS,
        )
    # "late" is renewed early on, so it expires later than the others; then it is stepped
    # back below and must keep its later expiry (a renewal never shortens a lease).
    late = await store.renew_lease(claims["late"].lease, now_ms=T0 + LEASE_MS - 1)
    await store.release_lease(claims["released"].lease, now_ms=T0 + 1)
    at = T0 + LEASE_MS  # every lease but "late" expired
    other = await store.claim_recovery(
        claims["superseded"].execution.id, owner="b", now_ms=at, lease_ms=LEASE_MS
    )
    renewed = await store.renew_leases(
        [claims["held"].lease, late, claims["released"].lease, claims["superseded"].lease],
        now_ms=at - 1,  # "held" is still live at this instant
    )
    assert {r.execution_id: r.expires_at_ms for r in renewed} == {
        claims["held"].execution.id: at - 1 + LEASE_MS,
        claims["late"].execution.id: late.expires_at_ms,  # already later: kept
    }
    assert all(r.token == claims[r.work_id].lease.token for r in renewed)
    # The renewed expiry is stored: the lease survives past its first expiry.
    expired = {e.id for e in await store.expired_attempts(now_ms=at + 1)}
    assert claims["released"].execution.id in expired
    assert not expired & {claims["held"].execution.id, claims["late"].execution.id}
    # Negative control: the recovered attempt's new holder still holds it.
    assert await store.renew_leases([other.lease], now_ms=at + 1) != []
    assert await store.renew_leases([], now_ms=at) == []


async def test_claim_recoveries_claims_each_as_claim_recovery_would_and_refuses_the_rest(
    store: Store,
) -> None:
    """``claim_recoveries``: one call, one entry per distinct id in the order given; each claim
    keeps ``claim_recovery``'s rules (epoch + 1 and a recovered segment; a held recovery keeps
    its epoch and segment under a new token), each refusal is the error it would have raised."""
    at = T0 + LEASE_MS
    held = await _held(store, retry_at_ms=at + 500)  # Work "w", epoch 2, held
    claims = {}
    for name in ("expired", "released", "live", "done"):
        await store.create_work(make_work(name))
        claims[name] = await _claim(store, name, at - LEASE_MS // 2 if name == "live" else T0)
    await store.release_lease(claims["released"].lease, now_ms=T0 + 1)
    await _complete(store, claims["done"], T0 + 2)
    ids = {name: claim.execution.id for name, claim in claims.items()}
    now = at + 500
    order = [ids["live"], held.id, "nope", ids["expired"], ids["done"], ids["released"]]
    results = await store.claim_recoveries(
        [*order, ids["expired"]], owner="heir", now_ms=now, lease_ms=LEASE_MS
    )
    assert [r.execution.id if isinstance(r, Claim) else r.execution_id for r in results] == order
    refused = {r.execution_id: r.code for r in results if isinstance(r, RecoveryRefusal)}
    assert refused == {
        ids["live"]: "not_eligible",
        "nope": "not_found",
        ids["done"]: "not_eligible",
    }
    got = {r.execution.id: r for r in results if isinstance(r, Claim)}
    for name in ("expired", "released"):
        new, old = got[ids[name]], claims[name]
        ex = new.execution
        assert (ex.epoch, ex.status, new.lease.epoch) == (2, ExecutionStatus.RECOVERING, 2)
        assert (new.lease.owner, new.lease.expires_at_ms) == ("heir", now + LEASE_MS)
        assert new.lease.token != old.lease.token
        lost, recovered = ex.segments
        assert lost.ended_at_ms == recovered.started_at_ms == now
        assert (recovered.recovered, recovered.epoch, recovered.ended_at_ms) == (True, 2, None)
        assert new.work.id == name
        # What was returned is what was stored, and the old holder is fenced out.
        assert await store.get_execution(ex.id) == ex
        assert await store.get_lease(ex.id) == new.lease
        with pytest.raises(LeaseLostError):
            await store.renew_lease(old.lease, now_ms=now + 1)
        assert await store.renew_lease(new.lease, now_ms=now + 1)
    again = got[held.id]
    assert again.execution.epoch == again.lease.epoch == 2  # the same recovery, tried again
    assert len(again.execution.segments) == len(held.segments)
    assert again.execution.recovery_hold == held.recovery_hold
    assert again.lease.owner == "heir"
    assert await store.get_execution(held.id) == again.execution
    # The refused ones are untouched: the live one's holder still holds it.
    assert await store.renew_lease(claims["live"].lease, now_ms=now + 1)
    assert (await store.get_execution(ids["done"])).status is ExecutionStatus.COMPLETED
    # Claimed ones are held now: a second call refuses them all; an empty call is a no-op.
    second = await store.claim_recoveries(list(got), owner="x", now_ms=now + 2, lease_ms=LEASE_MS)
    assert {r.code for r in second if isinstance(r, RecoveryRefusal)} == {"not_eligible"}
    assert len(second) == len(got)
    assert await store.claim_recoveries([], owner="x", now_ms=now, lease_ms=LEASE_MS) == []


async def test_claim_recoveries_racing_claim_each_attempt_once(
    store_factory: StoreFactory,
) -> None:
    """Two handles claim the same expired attempts at once, from both ends, in rounds: every
    attempt is claimed by exactly one of them, at epoch 2, and holds the winner's lease."""
    a = await store_factory.open()
    b = await store_factory.open()
    at = T0 + LEASE_MS

    async def claimer(name: str, store: Store, wanted: list[str], won: list[Claim]) -> None:
        for chunk in (wanted[:12], wanted[12:]):
            results = await store.claim_recoveries(chunk, owner=name, now_ms=at, lease_ms=LEASE_MS)
            won.extend(r for r in results if isinstance(r, Claim))

    try:
        for round_ in range(4):
            ids = []
            for n in range(24):
                await a.create_work(make_work(f"r{round_}-{n:02}"))
                ids.append((await _claim(a, f"r{round_}-{n:02}")).execution.id)
            won: dict[str, list[Claim]] = {"a": [], "b": []}
            async with anyio.create_task_group() as tg:
                tg.start_soon(claimer, "a", a, ids, won["a"])
                tg.start_soon(claimer, "b", b, ids[::-1], won["b"])
            claimed = [c.execution.id for c in won["a"] + won["b"]]
            assert sorted(claimed) == sorted(ids)  # each once, none lost
            for owner, mine in won.items():
                for claim in mine:
                    assert claim.execution.epoch == 2
                    assert await a.get_lease(claim.execution.id) == claim.lease
                    assert claim.lease.owner == owner
    finally:
        await a.aclose()
        await b.aclose()
