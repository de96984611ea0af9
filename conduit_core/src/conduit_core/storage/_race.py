"""Multi-process race harness for the conformance suite: racers that really overlap.

Each round, every racer process waits at a barrier, then claims (all at once), then waits at a
second barrier while **holding** whatever it claimed, and only then completes it. So every
attempt claimed in a round stays live until every racer of that round has made its claim: the
live windows overlap for real (no sleep decides it). Each holder records the window in which it
knew it held the attempt, ``(work, attempt, held_from_ns, held_until_ns)`` on the system-wide
monotonic clock; that window lies inside the attempt's true live window (claim committed …
finish committed), so any overlap the records show happened in the store too.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any

import anyio
import anyio.to_thread

from conduit_core.model import AttemptSnapshot, Event, ExecutionStatus, Work, WorkStatus
from conduit_core.storage._contract import (
    AttemptEnd,
    CapacityLimits,
    Claim,
    ClaimRequest,
    NotEligibleError,
    Store,
)

__all__ = [
    "LIMIT_KINDS",
    "HeldWindow",
    "check_no_overlap",
    "drop_one_live_index",
    "max_overlap",
    "overlaps",
    "race_limits",
    "race_scope",
    "run_race",
]

#: (work id, attempt number, held from ns, held until ns)
HeldWindow = tuple[str, int, int, int]
_LEASE_MS = 60_000
_BARRIER_S = 120.0


#: The limits a ``"ready"`` race can claim against (``race_limits``).
LIMIT_KINDS = ("global", "global-known", "pool", "scope")
_POOL = "racepool"


def race_limits(kind: str, limit: int) -> tuple[CapacityLimits, str | None]:
    """The capacity a race claims against and the pool its attempts take a slot of.

    ``"global"``: the global limit (attempts of no pool), the binding's pool not given (a claim
    learns which limits apply from the Work it reads: three round trips); ``"global-known"``:
    the same with the binding's pool given (none), as a daemon gives it (one round trip,
    ``_ready_reads._read_at_once``); ``"pool"``: a named pool of the binding's executor;
    ``"scope"``: a limit on the scope ``team``, which the racers' Work reach as an ancestor
    (their scopes are ``team/a`` and ``team/b``, ``race_scope``).
    """
    if kind == "global":
        return CapacityLimits(global_limit=limit), None
    if kind == "global-known":
        return CapacityLimits(global_limit=limit, binding_pools={"b": None}), None
    if kind == "pool":
        return CapacityLimits(pool_limits={_POOL: limit}, binding_pools={"b": _POOL}), _POOL
    if kind == "scope":
        parents = {"team/a": "team", "team/b": "team"}
        return CapacityLimits(scope_limits={"team": limit}, scope_parents=parents), None
    raise ValueError(f"unknown limit kind {kind!r}; known: {', '.join(LIMIT_KINDS)}")


def race_scope(kind: str, n: int) -> str:
    """The scope of a race's ``n``-th Work: under the limited scope for ``"scope"``."""
    return ("team/a", "team/b")[n % 2] if kind == "scope" else "root"


def _snapshot(pool: str | None = None) -> AttemptSnapshot:
    return AttemptSnapshot(
        config_generation=1, binding="b", executor="inproc", executor_generation=1,
        timeout_seconds=3600, deadline_ms=2**62, pool=pool,
    )  # fmt: skip


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _ready(work: Work) -> Work:
    from msgspec.structs import replace

    return replace(work, status=WorkStatus.READY)


def _next_input(claim: Claim) -> Event:
    ident = f"race/{claim.execution.work_id}/{claim.execution.attempt}"
    return Event(
        id=ident, delivery_id=ident, type="race", work_id=claim.execution.work_id, pending=True,
        accepted_at_ms=_now_ms(),
    )  # fmt: skip


async def _claim(
    handle: Store, mode: str, work_ids: list[str], rng: random.Random, limit: int | None,
    kind: str,
) -> Claim | None:  # fmt: skip
    capacity, pool = (None, None) if limit is None else race_limits(kind, limit)
    if mode == "ready":  # what a daemon does: the next ready Work, capacity checked
        outcomes = await handle.claim_ready(
            limit=1, snapshot_for=lambda w: _snapshot(pool), owner="racer", now_ms=_now_ms(),
            lease_ms=_LEASE_MS, capacity=capacity,
        )  # fmt: skip
        return next((o for o in outcomes if isinstance(o, Claim)), None)
    request = ClaimRequest(work_id=rng.choice(work_ids), snapshot=_snapshot(pool))
    try:
        return await handle.claim_attempt(
            request, owner="racer", now_ms=_now_ms(), lease_ms=_LEASE_MS, capacity=capacity
        )
    except NotEligibleError:  # includes CapacityError
        return None


def race_worker(
    url: str, mode: str, work_ids: list[str], rounds: int, limit: int | None,
    barrier: Any, results: Any, seed: int, kind: str = "global",
) -> None:  # fmt: skip
    """One racer process: ``rounds`` rounds of claim, hold until all claimed, complete."""
    from conduit_core.storage._open import open_store

    async def run() -> list[HeldWindow]:
        rng = random.Random(seed)
        handle = await open_store(url)
        windows: list[HeldWindow] = []
        try:
            for _ in range(rounds):
                await anyio.to_thread.run_sync(barrier.wait, _BARRIER_S)
                claim = await _claim(handle, mode, work_ids, rng, limit, kind)
                held_from = time.monotonic_ns()
                # Hold the attempt until every racer of this round has claimed (or refused).
                await anyio.to_thread.run_sync(barrier.wait, _BARRIER_S)
                if claim is None:
                    continue
                held_until = time.monotonic_ns()
                end = AttemptEnd(status=ExecutionStatus.COMPLETED, exclusion_confirmed=True)
                await handle.finish_attempt(claim.lease, end, now_ms=_now_ms(), work=_ready)
                # The next round needs input: standing Work idles without it.
                await handle.accept_event(_next_input(claim))
                windows.append(
                    (claim.execution.work_id, claim.execution.attempt, held_from, held_until)
                )
        except BaseException:
            barrier.abort()  # the other racers fail fast instead of waiting for the deadline
            raise
        finally:
            await handle.aclose()
        return windows

    results.put(anyio.run(run))


def run_race(
    url: str, work_ids: list[str], *, mode: str, processes: int, rounds: int,
    limit: int | None = None, kind: str = "global",
) -> list[HeldWindow]:  # fmt: skip
    """Run ``race_worker`` in ``processes`` spawned processes; every window each one held.

    ``mode`` ``"ready"`` claims the next ready Work (``claim_ready``), ``"pick"`` a random one
    of ``work_ids`` (``claim_attempt``); ``limit`` is a capacity limit for the claims, of the
    ``kind`` ``race_limits`` names (the Work should be made in ``race_scope(kind, n)``).
    """
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    racers = [
        ctx.Process(
            target=race_worker, args=(url, mode, work_ids, rounds, limit, barrier, results, n, kind)
        )
        for n in range(processes)
    ]
    for racer in racers:
        racer.start()
    windows: list[HeldWindow] = []
    try:
        for _ in racers:
            windows.extend(results.get(timeout=rounds * 10 + 60))
    finally:
        for racer in racers:
            racer.join(timeout=30)
            if racer.exitcode is None:
                racer.kill()
    assert all(r.exitcode == 0 for r in racers), [r.exitcode for r in racers]
    return windows


def overlaps(windows: list[HeldWindow]) -> list[str]:
    """Per Work: each duplicate attempt number, and each two attempts held at the same time."""
    by_work: dict[str, list[tuple[int, int, int]]] = {}
    for work_id, attempt, held_from, held_until in windows:
        by_work.setdefault(work_id, []).append((attempt, held_from, held_until))
    found: list[str] = []
    for work_id, attempts in by_work.items():
        numbers = sorted(a for a, _, _ in attempts)
        if len(numbers) != len(set(numbers)):
            found.append(f"{work_id}: duplicate attempts {numbers}")
        attempts.sort(key=lambda a: a[1])
        latest: tuple[int, int] | None = None  # (attempt, held until) reaching furthest
        for n, since, until in attempts:
            if latest is not None and latest[1] >= since:
                found.append(f"{work_id}: attempts {latest[0]} and {n} were live together")
            if latest is None or until > latest[1]:
                latest = (n, until)
    return found


def check_no_overlap(windows: list[HeldWindow]) -> None:
    """Per Work: attempt numbers unique, and no two attempts held at the same time."""
    found = overlaps(windows)
    assert not found, "; ".join(found)


def max_overlap(windows: list[HeldWindow]) -> int:
    """The most windows held at one instant (a sweep over their ends)."""
    edges = sorted(
        [(w[2], 1) for w in windows] + [(w[3], -1) for w in windows],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    alive = peak = 0
    for _, step in edges:
        alive += step
        peak = max(peak, alive)
    return peak


def drop_one_live_index(url: str) -> None:
    """Drop the store's unique index ``conduit_execution_one_live``: the database's own
    backstop for invariant 1, removed (with the claim's check, ``work_exclusion``) by the
    per-Work exclusivity race's negative control only. Never on a store that matters."""
    from conduit_core.storage._open import open_store_sync

    store: Any = open_store_sync(url)
    try:
        store.transaction(lambda cx: cx.run("DROP INDEX IF EXISTS conduit_execution_one_live"))
    finally:
        store.close()
