"""Procrastinate's side of bench_daemon.py, run with the peers' venv (procrastinate installed).

    python _peer_procrastinate.py schema   --db NAME
    python _peer_procrastinate.py worker   --db NAME --concurrency W --job-ms N --start-log PATH
                                           --ready PATH
    python _peer_procrastinate.py produce  --db NAME --rate R --seconds S --start-log PATH
                                           --counters PATH [--backlog DEPTH]

The worker is Procrastinate's own (``run_worker_async``, LISTEN/NOTIFY on, default polling), in
its own process as a user deploys it; its job appends its start to the start log, then sleeps
``job-ms``. The producer defers in bulk (``batch_defer_async``) at the offered rate, the same
:class:`_load.Producer` that feeds conduit, and writes its counters to a JSON file each tick.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time

import procrastinate
from _load import Producer, StartLog, append_line

PG_SOCKET = os.environ.get("BENCH_PG_HOST", "/var/run/postgresql")
PG_PORT = os.environ.get("BENCH_PG_PORT", "5432")
PG_USER = os.environ.get("BENCH_PG_USER", "root")


def make_app(db: str) -> procrastinate.App:
    conninfo = f"host={PG_SOCKET} port={PG_PORT} user={PG_USER} dbname={db}"
    return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))


async def schema(args: argparse.Namespace) -> None:
    app = make_app(args.db)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def worker(args: argparse.Namespace) -> None:
    app = make_app(args.db)
    start_log, delay_s = args.start_log, args.job_ms / 1000

    @app.task(name="job")
    async def job(job_id: str, t0: float) -> None:
        append_line(start_log, f"{job_id} {t0} {time.time():.6f}\n")
        if delay_s > 0:
            await asyncio.sleep(delay_s)

    async with app.open_async():
        worker = asyncio.ensure_future(app.run_worker_async(concurrency=args.concurrency))
        await asyncio.sleep(0.5)  # its LISTEN is in place by then (it polls too, each 5 s)
        append_line(args.ready, "ready\n")
        await worker


def produce(args: argparse.Namespace) -> None:
    loop = asyncio.new_event_loop()
    app = make_app(args.db)

    @app.task(name="job")
    async def task(job_id: str, t0: float) -> None:  # the worker defines what it does
        return None

    loop.run_until_complete(app.open_async())
    started = StartLog(args.start_log)
    seen = {"n": 0}

    def count_started() -> int:
        seen["n"] += len(started.read())
        return seen["n"]

    def submit(batch: list[tuple[str, float]]) -> None:
        kwargs = [{"job_id": job_id, "t0": t0} for job_id, t0 in batch]
        loop.run_until_complete(task.batch_defer_async(*kwargs))

    started_count = count_started if args.backlog else None
    producer = Producer(submit, rate=args.rate, backlog=args.backlog, started=started_count)

    def write_counters() -> None:
        while True:
            tmp = f"{args.counters}.tmp"
            with open(tmp, "w") as f:
                json.dump({"submitted": producer.submitted, "offered": producer.offered,
                           "failures": producer.failures, "done": done.is_set()}, f)  # fmt: skip
            os.replace(tmp, args.counters)
            if done.is_set():
                return
            time.sleep(0.05)

    done = threading.Event()
    writer = threading.Thread(target=write_counters)
    writer.start()
    producer.run(args.seconds)
    producer.flush(30)
    done.set()
    writer.join()
    loop.run_until_complete(app.close_async())
    loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["schema", "worker", "produce"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--job-ms", type=float, default=1.0)
    parser.add_argument("--start-log")
    parser.add_argument("--counters")
    parser.add_argument("--ready", help="the worker touches this file once it runs")
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--backlog", type=int)
    args = parser.parse_args()
    if args.what == "schema":
        asyncio.run(schema(args))
    elif args.what == "worker":
        asyncio.run(worker(args))
    else:
        produce(args)


if __name__ == "__main__":
    main()
