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

import itertools
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

__all__ = ["HeldWindow", "check_no_overlap", "max_overlap", "run_race"]

#: (work id, attempt number, held from ns, held until ns)
HeldWindow = tuple[str, int, int, int]
_LEASE_MS = 60_000
_BARRIER_S = 120.0


def _snapshot() -> AttemptSnapshot:
    return AttemptSnapshot(
        config_generation=1, binding="b", executor="inproc", executor_generation=1,
        timeout_seconds=3600, deadline_ms=2**62,
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
    handle: Store, mode: str, work_ids: list[str], rng: random.Random, limit: int | None
) -> Claim | None:
    capacity = None if limit is None else CapacityLimits(global_limit=limit)
    if mode == "ready":  # what a daemon does: the next ready Work, capacity checked
        outcomes = await handle.claim_ready(
            limit=1, snapshot_for=lambda w: _snapshot(), owner="racer", now_ms=_now_ms(),
            lease_ms=_LEASE_MS, capacity=capacity,
        )  # fmt: skip
        return next((o for o in outcomes if isinstance(o, Claim)), None)
    request = ClaimRequest(work_id=rng.choice(work_ids), snapshot=_snapshot())
    try:
        return await handle.claim_attempt(
            request, owner="racer", now_ms=_now_ms(), lease_ms=_LEASE_MS, capacity=capacity
        )
    except NotEligibleError:  # includes CapacityError
        return None


def race_worker(
    url: str, mode: str, work_ids: list[str], rounds: int, limit: int | None,
    barrier: Any, results: Any, seed: int,
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
                claim = await _claim(handle, mode, work_ids, rng, limit)
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
    limit: int | None = None,
) -> list[HeldWindow]:  # fmt: skip
    """Run ``race_worker`` in ``processes`` spawned processes; every window each one held.

    ``mode`` ``"ready"`` claims the next ready Work (``claim_ready``), ``"pick"`` a random one
    of ``work_ids`` (``claim_attempt``); ``limit`` is a global capacity limit for the claims.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    racers = [
        ctx.Process(
            target=race_worker, args=(url, mode, work_ids, rounds, limit, barrier, results, n)
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


def check_no_overlap(windows: list[HeldWindow]) -> None:
    """Per Work: attempt numbers unique, and no two attempts held at the same time."""
    by_work: dict[str, list[tuple[int, int, int]]] = {}
    for work_id, attempt, held_from, held_until in windows:
        by_work.setdefault(work_id, []).append((attempt, held_from, held_until))
    for work_id, attempts in by_work.items():
        numbers = sorted(a for a, _, _ in attempts)
        assert len(numbers) == len(set(numbers)), f"{work_id}: duplicate attempts {numbers}"
        attempts.sort(key=lambda a: a[1])
        for (n1, _, until), (n2, since, _) in itertools.pairwise(attempts):
            assert until < since, f"{work_id}: attempts {n1} and {n2} were live together"


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
