"""The cost of a keyed submit (dedup, debounce) against a plain one, per store.

    .venv/bin/python bench/bench_dedup.py [--backend sqlite|postgres|all] [--n 1000]

Each case submits ``n`` Work one at a time through the store (``create_work`` or
``submit_keyed``), ``concurrency`` submitters at once, on a fresh store: plain submits, keyed
submits with a new key each (every one creates), keyed submits with ten keys (most answer with
the existing Work: a row read and lock), debounced submits with ten keys (most join: a timer
replaced, an input accepted). Prints submits/s and each case's ratio to the plain one, in one
run (the machine is shared: compare the ratios, not the rates).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import anyio
import msgspec
from bench_store import _PgDatabase, fresh_sqlite  # type: ignore[import-not-found]

from conduit_core.model import WorkKind
from conduit_core.storage import Store, SubmitKey, open_store
from conduit_core.storage.conformance import make_input, make_work

T0 = 1_700_000_000_000


def _key(case: str, n: int) -> SubmitKey | None:
    if case == "plain":
        return None
    if case == "dedup-new":
        return SubmitKey(key=f"k{n}")
    if case == "dedup-10":
        return SubmitKey(key=f"k{n % 10}")
    return SubmitKey(key=f"k{n % 10}", quiet_ms=3_600_000)


async def _run(store: Store, case: str, n: int, concurrency: int) -> float:
    limiter = anyio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with limiter:
            work = msgspec.structs.replace(make_work(f"{case}-{i}", kind=WorkKind.TASK),
                                           created_at_ms=T0 + i)  # fmt: skip
            key = _key(case, i)
            if key is None:
                await store.create_work(work, first_input=make_input(f"{case}-{i}"))
            else:
                await store.submit_keyed(work, key, first_input=make_input(f"{case}-{i}"),
                                         now_ms=T0 + i)  # fmt: skip

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return n / (time.perf_counter() - started)


async def bench(url: str, n: int, concurrency: int) -> dict[str, float]:
    rates: dict[str, float] = {}
    store = await open_store(url)
    try:
        for case in ("plain", "dedup-new", "dedup-10", "debounce-10"):
            rates[case] = await _run(store, case, n, concurrency)
    finally:
        await store.aclose()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    for backend in backends:
        if backend == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                rates = anyio.run(bench, fresh_sqlite(Path(tmp), "b.db"), args.n, args.concurrency)
        else:
            with _PgDatabase() as url:
                rates = anyio.run(bench, url, args.n, args.concurrency)
        plain = rates["plain"]
        for case, rate in rates.items():
            print(f"{backend:8} {case:12} {rate:8.0f} submits/s  ratio {rate / plain:.2f}")


if __name__ == "__main__":
    main()
