"""A scope limit's backlog costs a claim's read nothing (issue 32, a sibling of the key backlog).

A claim read each binding's ready Work in claim order and filtered out the Work of a full scope
(``skip_scopes``) and, under a scope with room, the scope's own Work from the read of the rest
(``scopes_out``) as it walked: a scope with a backlog queued ahead cost every claim a pass over
it (20,000 ahead: 9 ms a claim on SQLite, 11 ms on PostgreSQL; through the daemon, half of what
it finished, ``bench_daemon.py --scope-backlog``). Where a scope limit shapes the read, each
(binding, scope) with ready Work is now found first (a skip scan of the ready index, a probe
per pair) and read through its own range of ``conduit_work_ready_binding`` (schema 20: binding,
scope, ready_since, id), and a full scope's range is never entered
(``_ready_reads._scope_ranges_later``).

Both backends; the read's cost is measured on the database's side (``_read_cost``) with the
scope's backlog at 10, then at 3,000, queued ahead of 100 Work outside it, in the same binding
and in one of its own.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from conduit_core.model import Work
from conduit_core.storage import CapacityLimits, Claim, open_store
from conduit_core.storage._scope_ranges import MAX_PAIRS
from conduit_core.storage.conformance import T0, make_input, make_work, snapshot
from tests.storage._read_cost import read_cost, ready_ids

pytestmark = pytest.mark.anyio

BINDINGS = {"a": None, "s": None}


def _limits(scope_limit: int) -> CapacityLimits:
    """A daemon's limits: bindings ``a`` and ``s`` in the global pool, scope ``big`` (under
    ``team``, itself unlimited) limited to ``scope_limit``."""
    return CapacityLimits(global_limit=100, binding_pools=BINDINGS,
                          scope_limits={"big": scope_limit},
                          scope_parents={"big": "team", "team": "root"})  # fmt: skip


def _work(work_id: str, binding: str, scope: str, at: int) -> Work:
    return msgspec.structs.replace(make_work(work_id), binding=binding, scope=scope,
                                   created_at_ms=at, updated_at_ms=at)  # fmt: skip


async def _backlog(store: Any, first: int, count: int) -> None:
    """``count`` Work of scope ``big``, alternately of bindings ``a`` and ``s``, all queued
    ahead of the Work outside it."""
    await store.create_works([
        (_work(f"big{n:05}", "as"[n % 2], "big", T0 - 5_000 + n), make_input(f"big{n:05}"))
        for n in range(first, first + count)
    ])  # fmt: skip


async def _hold_a_slot_of_big(store: Any, capacity: CapacityLimits) -> None:
    await store.create_work(_work("big-head", "a", "big", T0 - 10_000),
                            first_input=make_input("big-head"))  # fmt: skip
    outcomes = await store.claim_ready(
        limit=1, snapshot_for=lambda work: snapshot(), owner="o", now_ms=T0 + 10,
        lease_ms=60_000, capacity=capacity,
    )  # fmt: skip
    assert [c.work.id for c in outcomes if isinstance(c, Claim)] == ["big-head"]


@pytest.mark.parametrize(
    ("scope_limit", "expected"),
    [(1, ["a000", "a001", "s000", "s001"]), (2, ["a000", "a001", "big00000", "s000"])],
    ids=["scope-full", "scope-with-room"],
)
@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
async def test_a_claim_reads_past_none_of_a_scopes_backlog(
    store_url: str, scope_limit: int, expected: list[str]
) -> None:
    """Scope ``big`` holds one slot; its backlog grows from 10 to 3,000, ahead of 100 Work of
    the root scope (50 of each binding). Full, none of it is read; with room for one, its
    oldest. Either way the read returns the same four Work and costs about the same (on the
    code before, SQLite's steps and PostgreSQL's tuples grew with the backlog)."""
    capacity = _limits(scope_limit)
    async with await open_store(store_url) as store:
        await _hold_a_slot_of_big(store, capacity)
        await _backlog(store, 0, 10)
        await store.create_works([
            (_work(f"{b}{n:03}", b, "root", T0 + 2 * n + i), make_input(f"{b}{n:03}"))
            for n in range(50) for i, b in enumerate("as")
        ])  # fmt: skip
        small, small_cost = read_cost(store_url, ready_ids(capacity))
        await _backlog(store, 10, 2_990)
        large, large_cost = read_cost(store_url, ready_ids(capacity))
    assert small == large == expected
    assert large_cost <= small_cost * 2 + 20, (small_cost, large_cost)


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
async def test_claims_take_every_scope_in_claim_order_within_its_limit(store_url: str) -> None:
    """Read by scope range, the claims still take the oldest Work first across scopes and
    bindings, a scope of the limit's subtree (``big``'s child ``big.x``) counted with it, and a
    scope this daemon has no limit for (``other``) read like the root's."""
    capacity = CapacityLimits(global_limit=100, binding_pools=BINDINGS,
                              scope_limits={"big": 2},
                              scope_parents={"big.x": "big", "big": "root"})  # fmt: skip
    works = [
        _work("w0", "a", "big", T0), _work("w1", "s", "other", T0 + 1),
        _work("w2", "a", "big.x", T0 + 2), _work("w3", "s", "big.x", T0 + 3),
        _work("w4", "a", "root", T0 + 4), _work("w5", "s", "root", T0 + 5),
    ]
    async with await open_store(store_url) as store:
        await store.create_works([(w, make_input(f"{w.id}-in")) for w in works])
        outcomes = await store.claim_ready(
            limit=10, snapshot_for=lambda work: snapshot(), owner="o", now_ms=T0 + 10,
            lease_ms=60_000, capacity=capacity,
        )  # fmt: skip
    claimed = [c.work.id for c in outcomes if isinstance(c, Claim)]
    assert claimed == ["w0", "w1", "w2", "w4", "w5"]


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
async def test_a_slice_of_more_scopes_than_a_statement_reads_is_walked(store_url: str) -> None:
    """More (binding, scope) pairs than one statement reads by range (``MAX_PAIRS``; SQLite
    takes 500 terms in a ``UNION ALL``): that slice is read by walking, as before, and still
    takes the oldest Work outside the full scope."""
    capacity = _limits(1)
    many = MAX_PAIRS + 6
    async with await open_store(store_url) as store:
        await _hold_a_slot_of_big(store, capacity)
        await _backlog(store, 0, 10)
        await store.create_works([
            (_work(f"m{n:03}", "a", f"scope{n:03}", T0 + many - n), make_input(f"m{n:03}"))
            for n in range(many)
        ])  # fmt: skip
        found, _ = read_cost(store_url, ready_ids(capacity))
    assert found == [f"m{n:03}" for n in range(many - 4, many)]
