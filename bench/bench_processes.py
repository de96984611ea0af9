"""Several scheduler processes on one PostgreSQL store: attempts/s and lock wait per transaction.

    .venv/bin/python bench/bench_processes.py --processes 1 2 4 --n 2000 --concurrency 16

Enqueues N no-op Work in a fresh database, then starts P scheduler processes (each a real
``Scheduler`` with its own store handle, lease keeper and ``--concurrency`` attempts in flight,
the test plugin's in-process ``echo`` executor) that drain the store together. Capacity limits
are store-wide (every daemon's slot holders count), so each process configures P x
``--concurrency`` as ``settings.concurrency``: P daemons, each with its own share. Prints, per P:
attempts/s (N over the wall time from the common start to the last process done), and the
lock wait per transaction: ``pg_stat_activity`` is sampled every 10 ms during the run, each
backend seen waiting on a heavyweight lock (``wait_event_type = 'Lock'``: the writers' advisory
lock, a row or a transaction) counts as 10 ms of waiting, divided by the transactions the
database committed meanwhile (``pg_stat_database.xact_commit``). ``advisory`` is the part spent
on the writers' lock itself.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time
from typing import Any

import anyio
import psycopg

from conduit_core.config import Binding
from conduit_core.daemon import tune_garbage_collection
from conduit_core.plugins import Plugins
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
from conduit_core.storage import Claim, open_store

try:
    from bench_scheduler import enqueue, fresh_url, gates_as_a_user_has_them
except ImportError:  # run as bench/bench_processes.py from the repository root
    from bench.bench_scheduler import enqueue, fresh_url, gates_as_a_user_has_them

SAMPLE_S = 0.01


async def drain(
    url: str, owner: str, concurrency: int, limit: int, start: Any
) -> tuple[int, float]:
    """Claim and run attempts until no ready Work is left; returns how many ran here and the
    CPU seconds this process spent on them. ``concurrency``: attempts in flight here; ``limit``:
    the store-wide limit every process configures (``settings.concurrency`` counts the slot
    holders of every daemon on the store)."""
    gates_as_a_user_has_them()
    tune_garbage_collection()  # as `conduit daemon` runs its process (daemon/_gc.py)
    async with await open_store(url) as store:
        sched = Scheduler(
            store, SystemClock(), Plugins.load(disabled=()),
            SchedulerOptions(owner=owner, concurrency=max(limit, 1),
                             bindings={"noop": Binding(executor="echo")}),
        )  # fmt: skip
        state = {"done": 0, "in_flight": 0}
        progress = anyio.Event()

        async def run_one(claim: Claim) -> None:
            nonlocal progress
            await sched.run_attempt(claim)
            state["done"] += 1
            state["in_flight"] -= 1
            progress.set()

        await anyio.to_thread.run_sync(start.wait)
        cpu0 = time.process_time()
        async with sched.keeping_leases(), anyio.create_task_group() as tg:
            while True:
                free = concurrency - state["in_flight"]
                claims = (await sched.claim_ready(free))[0] if free > 0 else []
                for claim in claims:
                    state["in_flight"] += 1
                    tg.start_soon(run_one, claim)
                if claims:
                    continue
                if state["in_flight"]:
                    await progress.wait()  # a slot frees when an attempt ends
                    progress = anyio.Event()
                elif not await store.ready_work(limit=1):
                    break  # nothing left (what others still run is theirs)
                else:
                    await anyio.sleep(0.01)  # ready rows another process is claiming right now
        return state["done"], time.process_time() - cpu0


def worker(url: str, owner: str, concurrency: int, limit: int, start: Any, results: Any) -> None:
    results.put(anyio.run(drain, url, owner, concurrency, limit, start))


class LockSampler(threading.Thread):
    """Samples lock waits of the bench database's backends until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.conn = psycopg.connect(url, autocommit=True)
        self.waiting = self.advisory = 0
        self.halt = threading.Event()

    def commits(self) -> int:
        row = self.conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        return int(row[0]) if row else 0

    def run(self) -> None:
        sql = (
            "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'), "
            "count(*) FILTER (WHERE wait_event = 'advisory') "
            "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        while not self.halt.wait(SAMPLE_S):
            row = self.conn.execute(sql).fetchone()
            if row:
                self.waiting += int(row[0])
                self.advisory += int(row[1])


def bench(processes: int, n: int, concurrency: int) -> str:
    url, keep = fresh_url("postgres")
    try:
        anyio.run(_enqueue, url, n)
        ctx = multiprocessing.get_context("spawn")
        # Every process connects, then all start together with the sampler (the barrier).
        start, results = ctx.Barrier(processes + 1), ctx.Queue()
        procs = [
            # Capacity is store-wide: P daemons that each run ``concurrency`` attempts share a
            # limit of P x ``concurrency`` (with ``concurrency`` alone, P processes would split
            # one process's slots between them, and no P could run more than one does).
            ctx.Process(
                target=worker,
                args=(url, f"p{i}", concurrency, concurrency * processes, start, results),
            )
            for i in range(processes)
        ]
        for proc in procs:
            proc.start()
        sampler = LockSampler(url)
        start.wait(600)
        commits0 = sampler.commits()
        sampler.start()
        t0 = time.perf_counter()
        done: list[tuple[int, float]] = [results.get(timeout=1800) for _ in procs]
        elapsed = time.perf_counter() - t0
        sampler.halt.set()
        sampler.join()
        commits = max(sampler.commits() - commits0, 1)
        sampler.conn.close()
        for proc in procs:
            proc.join(30)
        cpu_ms = sum(cpu for _, cpu in done) * 1000 / n
        ran = [count for count, _ in done]
        assert sum(ran) == n, f"ran {sum(ran)} of {n}"
        wait_ms = sampler.waiting * SAMPLE_S * 1000 / commits
        advisory_ms = sampler.advisory * SAMPLE_S * 1000 / commits
        return (
            f"processes={processes} concurrency={concurrency} n={n} attempts/s={n / elapsed:,.0f} "
            f"per-process={ran} client-cpu/attempt={cpu_ms:.1f} ms transactions={commits} "
            f"lock-wait/transaction={wait_ms:.2f} ms "
            f"(advisory {advisory_ms:.2f} ms)"
        )
    finally:
        keep.cleanup()  # type: ignore[attr-defined]


async def _enqueue(url: str, n: int) -> None:
    async with await open_store(url) as store:
        await enqueue(store, n, SystemClock().now_ms())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16, help="attempts in flight each")
    parser.add_argument("--rounds", type=int, default=1, help="alternate the P values N times")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    for _ in range(args.rounds):
        for processes in args.processes:
            print(bench(processes, args.n, args.concurrency), flush=True)


if __name__ == "__main__":
    main()
