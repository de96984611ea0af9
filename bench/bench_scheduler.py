"""Attempts started and completed per second through the embedded scheduler, no-op executor.

    .venv/bin/python bench/bench_scheduler.py --store sqlite --concurrency 1 4 64 --n 2000
    .venv/bin/python bench/bench_scheduler.py --store postgres --concurrency 64 --n 2000
    .venv/bin/python bench/bench_scheduler.py --peer-json --store sqlite --n 2000   # peers' format

The Work is stored first; then the scheduler runs as users run it (``conduit_core.embed``, the
assembly ``conduit daemon`` runs: its host loop, lease keeper, recovery) until all N completed.
Every attempt goes the whole way: claimed (batched, with capacity checked in the claim
transaction), launched under its held lease with its launch phases and recovery metadata written
fenced, observed, and settled in one fenced transaction. The executor is the test plugin's
in-process ``echo`` (it completes at once), so the figure is conduit's own overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import anyio

from conduit_core import embed
from conduit_core.config import Binding, parse_config
from conduit_core.daemon import tune_garbage_collection
from conduit_core.model import Event, Work
from conduit_core.plugins import Plugins
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock, TaskPool
from conduit_core.storage import Claim, Store, open_store

#: ``?synchronous=normal`` with --sqlite-normal (fewer disk syncs; not durable on power loss).
SQLITE_OPTIONS = ""
#: Each job's sleep (``--job-ms``): the echo binding's ``sleep_ms``.
JOB_MS = 0.0
PG_ADMIN = os.environ.get(
    "CONDUIT_BENCH_PG_URL", "postgresql://root@/postgres?host=/var/run/postgresql"
)


async def enqueue(store: Store, n: int, now: int) -> None:
    for i in range(n):
        wid = f"b{i:07d}"
        work = Work(id=wid, scope="root", binding="noop", created_at_ms=now, updated_at_ms=now)
        first = Event(
            id=f"{wid}/in", delivery_id=f"{wid}/in", type="input", work_id=wid, pending=True,
            accepted_at_ms=now,
        )  # fmt: skip
        await store.create_work(work, first_input=first)


async def process(sched: Scheduler, n: int, concurrency: int) -> int:
    """Keep ``concurrency`` attempts in flight until ``n`` have completed: a bare Scheduler
    driven by hand (bench_wire.py compares two executors on it); :func:`drain` is the host
    loop's."""
    state = {"done": 0, "in_flight": 0, "settling": 0}
    progress = anyio.Event()

    def settling() -> None:
        # A settlement is on its way: claim now, and the claim joins its batch (see
        # Scheduler.set_settling_listener), as the daemon's host loop does.
        state["settling"] += 1
        progress.set()

    sched.set_settling_listener(settling)

    async def run_one(claim: Claim) -> None:
        nonlocal progress
        await sched.run_attempt(claim)
        state["done"] += 1
        state["in_flight"] -= 1
        state["settling"] -= 1
        progress.set()

    async with anyio.create_task_group() as tg:
        tasks = TaskPool(tg)  # as the daemon's host loop runs its attempts
        while state["done"] < n:
            # Slots whose settlement is on its way count as free: the store's capacity check,
            # in the claim's transaction, is what holds the limit.
            free = concurrency - state["in_flight"] + max(state["settling"], 0)
            claims = (await sched.claim_ready(free))[0] if free > 0 else []
            for claim in claims:
                state["in_flight"] += 1
                tasks.start_soon(run_one, claim)
            if not claims:
                # Nothing to claim now: wait until an attempt finishes (no polling sleep).
                await progress.wait()
                progress = anyio.Event()
        tasks.close()
    return state["done"]


async def drain(embedded: embed.EmbeddedScheduler, n: int, concurrency: int) -> int:
    """Wait until the embedded scheduler's host loop has run ``n`` attempts to their end."""
    done = 0
    all_done = anyio.Event()

    def ended(claim: Claim) -> None:
        nonlocal done
        done += 1
        if done >= n:
            all_done.set()

    assert embedded.host is not None
    embedded.host.add_attempt_listener(ended)
    await all_done.wait()
    return done


def gates_as_a_user_has_them() -> None:
    """The test plugin, installed for its ``echo`` executor, also registers two start gates,
    which by default may hold every first start (the tests drive the asking path with plain
    Work). A user's install has the human gate, which may hold only the Work its rules select:
    make the test gates select only the Work whose input asks for them, as a user's would."""
    try:
        from conduit_test_plugin import plugin as test_plugin  # type: ignore[import-not-found]
    except ImportError:
        return
    test_plugin.ASK_EVERY_START = False


CONFIG = """\
[settings]
store = "{store}"
data_dir = "{data}"
concurrency = {concurrency}
job_concurrency = {concurrency}

[bindings.noop]
executor = "echo"
config = {{ sleep_ms = {sleep_ms} }}
"""


async def bench_embedded(url: str, n: int, concurrency: int) -> dict[str, object]:
    """What users run: the Work stored, then the embedded scheduler until all N completed."""
    gates_as_a_user_has_them()
    tune_garbage_collection()  # as `conduit daemon` runs its process (daemon/_gc.py)
    async with await open_store(url) as store:
        t0 = time.perf_counter()
        await enqueue(store, n, SystemClock().now_ms())
    with tempfile.TemporaryDirectory(prefix="conduit-bench-") as data:
        config = parse_config(
            CONFIG.format(store=url, data=data, concurrency=max(concurrency, 1), sleep_ms=JOB_MS),
            source=str(Path(data) / "conduit.toml"),
        )
        plugins = Plugins.load(disabled=())  # loaded before the clock starts
        t1, cpu1 = time.perf_counter(), time.process_time()
        # The scheduler as `conduit daemon` and every embedding process run it: its host loop
        # claims (batched, capacity checked in the claim), launches and settles.
        async with embed.run(config, plugins=plugins, routines=False) as scheduler:
            await drain(scheduler, n, concurrency)
            t2, cpu2 = time.perf_counter(), time.process_time()
            assert scheduler.store is not None
            left = await scheduler.store.ready_work(limit=1)
            assert not left, "every Work must be completed"
    return {
        "enqueue_s": round(t1 - t0, 3),
        "process_s": round(t2 - t1, 3),
        # This process's CPU (every thread) per attempt while processing: the store's client
        # work, the runtime and the event loop; the database server's is not counted.
        "cpu_ms_per_attempt": round((cpu2 - cpu1) / n * 1000, 3),
    }


async def bench_one(url: str, n: int, concurrency: int) -> dict[str, object]:
    """The scheduling core alone (``--bare``): a Scheduler driven by :func:`process`, no host
    loop. bench_then_now.py and bench_statements.py compare checkouts on it."""
    gates_as_a_user_has_them()
    tune_garbage_collection()  # as `conduit daemon` runs its process (daemon/_gc.py)
    async with await open_store(url) as store:
        sched = Scheduler(
            store,
            SystemClock(),
            Plugins.load(disabled=()),
            SchedulerOptions(
                owner="bench",
                concurrency=max(concurrency, 1),
                bindings={"noop": Binding(executor="echo")},
            ),
        )
        t0 = time.perf_counter()
        await enqueue(store, n, SystemClock().now_ms())
        t1, cpu1 = time.perf_counter(), time.process_time()
        async with sched.keeping_leases():
            await process(sched, n, concurrency)
        t2, cpu2 = time.perf_counter(), time.process_time()
        left = await store.ready_work(limit=1)
        assert not left, "every Work must be completed"
    return {
        "enqueue_s": round(t1 - t0, 3),
        "process_s": round(t2 - t1, 3),
        # This process's CPU (every thread) per attempt while processing: the store's client
        # work, the runtime and the event loop; the database server's is not counted.
        "cpu_ms_per_attempt": round((cpu2 - cpu1) / n * 1000, 3),
    }


def fresh_url(kind: str) -> tuple[str, object]:
    if kind == "sqlite":
        tmp = tempfile.TemporaryDirectory()
        return f"sqlite://{Path(tmp.name) / 'bench.db'}{SQLITE_OPTIONS}", tmp
    import psycopg

    name = f"conduit_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, query = PG_ADMIN.partition("?")
    url = base.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")

    class Drop:
        def cleanup(self) -> None:
            with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return url, Drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 64])
    parser.add_argument("--peer-json", action="store_true", help="print the peers' JSON line")
    parser.add_argument(
        "--bare", action="store_true",
        help="drive a bare Scheduler by hand (the scheduling core alone, no host loop)",
    )  # fmt: skip
    parser.add_argument(
        "--sqlite-normal", action="store_true", help="open SQLite with synchronous=normal"
    )
    parser.add_argument(
        "--job-ms", type=float, default=0.0,
        help="each job sleeps this long (the echo binding's sleep_ms), as bench_daemon's jobs do",
    )  # fmt: skip
    args = parser.parse_args()
    if args.bare and args.job_ms:
        parser.error("--job-ms is for the embedded scheduler (its binding config), not --bare")
    global SQLITE_OPTIONS, JOB_MS
    JOB_MS = args.job_ms
    SQLITE_OPTIONS = "?synchronous=normal" if args.sqlite_normal else ""
    for concurrency in args.concurrency:
        url, keep = fresh_url(args.store)
        try:
            figures = anyio.run(bench_one if args.bare else bench_embedded, url, args.n,
                                concurrency)  # fmt: skip
        finally:
            cleanup = getattr(keep, "cleanup", None)
            if cleanup:
                cleanup()
        rate = args.n / float(figures["process_s"])  # type: ignore[arg-type]
        if args.peer_json:
            print(json.dumps({
                "peer": "conduit", "store": args.store, "n": args.n, **figures,
                "jobs_per_s": round(rate, 1), "concurrency": concurrency, "poll_s": None,
            }))  # fmt: skip
        else:
            print(
                f"{args.store:8} {'bare' if args.bare else 'embedded':8} "
                f"concurrency={concurrency:<3} n={args.n} "
                f"enqueue={figures['enqueue_s']}s process={figures['process_s']}s "
                f"attempts/s={rate:,.0f} cpu/attempt={figures['cpu_ms_per_attempt']}ms"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
