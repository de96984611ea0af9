"""Conformance cases for host labels in the claim (``CapacityLimits.skip_bindings``) and for
the daemon registry (``record_daemon``, ``list_daemons``): a claimer that lacks a label reads
none of its bindings' Work from the ready queue, with or without per-binding pools, and is
refused one by id (``missing_label``). Import them like :mod:`conduit_core.storage.conformance`'s.
"""

from __future__ import annotations

import msgspec
import pytest

from conduit_core.model import DaemonRecord, DaemonState
from conduit_core.storage._contract import (
    CapacityLimits,
    Claim,
    ClaimRefusal,
    ClaimRequest,
    Store,
)
from conduit_core.storage.conformance import T0, make_input, make_work, snapshot

__all__ = [
    "test_a_claim_by_id_of_a_binding_it_lacks_a_label_for_is_refused",
    "test_expired_attempts_of_bindings_it_lacks_a_label_for_never_fill_its_read",
    "test_a_claim_from_the_ready_queue_skips_bindings_it_lacks_a_label_for",
    "test_the_daemon_registry_keeps_one_row_per_daemon",
]

pytestmark = pytest.mark.anyio


async def _submit(store: Store, specs: list[tuple[str, str]]) -> None:
    for work_id, binding in specs:
        work = msgspec.structs.replace(make_work(work_id), binding=binding)
        await store.create_work(work, first_input=make_input(f"{work_id}-in"))


@pytest.mark.parametrize(
    "pools",
    [
        pytest.param({}, id="sized-overall"),
        pytest.param({"gpu": None, "plain": None}, id="one-pool"),
        pytest.param({"gpu": "p", "plain": None}, id="two-pools"),
    ],
)
async def test_a_claim_from_the_ready_queue_skips_bindings_it_lacks_a_label_for(
    store: Store, pools: dict[str, str | None]
) -> None:
    # The gpu Work is older: without the rule it would be claimed first.
    await _submit(store, [("g1", "gpu"), ("g2", "gpu"), ("p1", "plain"), ("p2", "plain")])
    limits = CapacityLimits(
        global_limit=8, pool_limits={"p": 8}, binding_pools=pools, skip_bindings=("gpu",)
    )
    outcomes = await store.claim_ready(
        limit=8, snapshot_for=lambda work: snapshot(), owner="plain-host", now_ms=T0,
        lease_ms=30_000, capacity=limits,
    )  # fmt: skip
    assert sorted(o.work.id for o in outcomes if isinstance(o, Claim)) == ["p1", "p2"]
    assert [o for o in outcomes if not isinstance(o, Claim)] == []
    # A claimer with the label takes the rest.
    with_label = msgspec.structs.replace(limits, skip_bindings=())
    outcomes = await store.claim_ready(
        limit=8, snapshot_for=lambda work: snapshot(), owner="gpu-host", now_ms=T0,
        lease_ms=30_000, capacity=with_label,
    )  # fmt: skip
    assert sorted(o.work.id for o in outcomes if isinstance(o, Claim)) == ["g1", "g2"]


async def test_a_claim_by_id_of_a_binding_it_lacks_a_label_for_is_refused(store: Store) -> None:
    await _submit(store, [("g1", "gpu")])
    limits = CapacityLimits(global_limit=8, skip_bindings=("gpu",))
    (outcome,) = await store.claim_attempts(
        [ClaimRequest(work_id="g1", snapshot=snapshot())], owner="plain-host", now_ms=T0,
        lease_ms=30_000, capacity=limits,
    )  # fmt: skip
    assert isinstance(outcome, ClaimRefusal)
    assert outcome.code == "missing_label"
    work = await store.get_work("g1")
    assert str(work.status) == "ready"
    assert work.last_attempt == 0


async def test_expired_attempts_of_bindings_it_lacks_a_label_for_never_fill_its_read(
    store: Store,
) -> None:
    """A recovery reads the earliest expired leases, ``limit`` at a time. Those of a binding the
    reader lacks a label for were taken out after the read: once there were ``limit`` of them
    (a labelled daemon lost with that many jobs), every read was only those, and no other
    expired attempt was recovered by the daemons without the label. They are left out in the
    read itself now."""
    await _submit(store, [("g1", "gpu"), ("g2", "gpu"), ("g3", "gpu"), ("p1", "plain")])
    for n, work_id in enumerate(("g1", "g2", "g3", "p1")):
        binding = "gpu" if work_id.startswith("g") else "plain"
        pinned = msgspec.structs.replace(snapshot(), binding=binding)
        (claim,) = await store.claim_attempts(
            [ClaimRequest(work_id=work_id, snapshot=pinned)], owner="gone", now_ms=T0 + n,
            lease_ms=1_000,
        )  # fmt: skip
        assert isinstance(claim, Claim)
    later = T0 + 10_000
    everything = await store.expired_attempts(now_ms=later, limit=3)
    assert [e.work_id for e in everything] == ["g1", "g2", "g3"]
    mine = await store.expired_attempts(now_ms=later, limit=3, skip_bindings=("gpu",))
    assert [e.work_id for e in mine] == ["p1"]


async def test_the_daemon_registry_keeps_one_row_per_daemon(store: Store) -> None:
    assert await store.list_daemons() == []
    first = DaemonRecord(id="h/1/aa", host="h", pid=1, labels=["gpu"], started_at_ms=T0,
                         last_seen_ms=T0)  # fmt: skip
    await store.record_daemon(first)
    later = msgspec.structs.replace(first, state=DaemonState.DRAINING, load=3,
                                    last_seen_ms=T0 + 5_000)  # fmt: skip
    await store.record_daemon(later)
    other = DaemonRecord(id="h/2/bb", host="h", pid=2, started_at_ms=T0,
                         last_seen_ms=T0 + 5_000)  # fmt: skip
    await store.record_daemon(other)
    assert await store.list_daemons() == [later, other]
    assert later.state_at(T0 + 5_000 + 30_000) is DaemonState.DRAINING
    assert later.state_at(T0 + 5_000 + 30_001) is DaemonState.LOST
    stopped = msgspec.structs.replace(other, state=DaemonState.STOPPED)
    assert stopped.state_at(T0 + 10**9) is DaemonState.STOPPED
    # A week later, a daemon's write drops the rows nobody wrote since.
    week = 7 * 24 * 3600 * 1000
    await store.record_daemon(msgspec.structs.replace(later, last_seen_ms=T0 + week + 5_001))
    assert [d.id for d in await store.list_daemons()] == ["h/1/aa"]
