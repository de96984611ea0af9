"""Recovery claims of a thousand lost attempts: one by one (``claim_recovery``) or set-based
(``claim_recoveries``), side by side on one store.

    .venv/bin/python bench/bench_recovery_claims.py                    # both stores, 3 rounds
    .venv/bin/python bench/bench_recovery_claims.py --store postgres --attempts 200

Per round and way: a fresh store (SQLite file or scratch PostgreSQL database) with N attempts
claimed and their leases expired; then the time to claim the recovery of all N. "One by one" is
what recovery did before ``claim_recoveries``: a ``claim_recovery`` per attempt, 128 in flight,
sharing group-commit transactions. Prints one JSON line per round and way.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import anyio
from chaos_drill import scratch_store  # type: ignore[import-not-found]

from conduit_core.storage import Claim, ClaimRequest, Store, open_store
from conduit_core.storage.conformance import LEASE_MS, T0, make_input, make_work, snapshot


async def _lost(store: Store, attempts: int) -> list[str]:
    requests = []
    for n in range(attempts):
        await store.create_work(make_work(f"w{n:05}"), first_input=make_input(f"{n}"))
        requests.append(ClaimRequest(work_id=f"w{n:05}", snapshot=snapshot()))
    ids = []
    for start in range(0, attempts, 200):
        claimed = await store.claim_attempts(
            requests[start : start + 200], owner="dead", now_ms=T0, lease_ms=LEASE_MS
        )
        ids += [c.execution.id for c in claimed if isinstance(c, Claim)]
    return ids


async def _one_by_one(store: Store, ids: list[str], at: int) -> int:
    claimed = 0
    limiter = anyio.CapacityLimiter(128)

    async def claim(execution_id: str) -> None:
        nonlocal claimed
        async with limiter:
            await store.claim_recovery(execution_id, owner="heir", now_ms=at, lease_ms=LEASE_MS)
            claimed += 1

    async with anyio.create_task_group() as tg:
        for execution_id in ids:
            tg.start_soon(claim, execution_id)
    return claimed


async def _set_based(store: Store, ids: list[str], at: int) -> int:
    results = await store.claim_recoveries(ids, owner="heir", now_ms=at, lease_ms=LEASE_MS)
    return sum(isinstance(r, Claim) for r in results)


async def measure(kind: str, way: str, attempts: int) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="conduit-bench-claims-"))
    try:
        with scratch_store(kind, root, "conduit_bench_claims") as url:
            async with await open_store(url) as store:
                ids = await _lost(store, attempts)
                started = time.perf_counter()
                claim = _one_by_one if way == "one_by_one" else _set_based
                claimed = await claim(store, ids, T0 + LEASE_MS)
                seconds = time.perf_counter() - started
            return {"store": kind, "way": way, "claimed": claimed, "ms": round(seconds * 1000)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def main_async(args: argparse.Namespace) -> None:
    for kind in args.store:
        for _ in range(args.rounds):
            for way in ("one_by_one", "set_based"):
                print(json.dumps(await measure(kind, way, args.attempts)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", nargs="+", choices=("sqlite", "postgres"),
                        default=["sqlite", "postgres"])  # fmt: skip
    parser.add_argument("--attempts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    anyio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
