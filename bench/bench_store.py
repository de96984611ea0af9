"""Claims + completions per second on each store backend, empty and with 1,000,000 finished Work.

    .venv/bin/python bench/bench_store.py [--backend sqlite|postgres|all] [--rows 1000000]

Each measured attempt is one claim (taken in batches by ``claim_ready``, as the daemon does) and
one completion (``finish_attempt``, its own transaction). The large store is bulk-loaded with
finished Work and their completed attempts straight into the tables (executemany / COPY), not
through the API. The per-attempt cost should stay flat: ratio ≤ 1.3.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import msgspec

from conduit_core.model import Execution, ExecutionStatus, Segment, Work, WorkStatus
from conduit_core.storage import AttemptEnd, Claim, SqlStore, open_store
from conduit_core.storage._sql import (
    EXECUTION_COLUMNS,
    WORK_COLUMNS,
    WORK_MARKS,
    execution_params,
    work_params,
)
from conduit_core.storage.conformance import make_input, make_work, snapshot

PG_URL = os.environ.get(
    "CONDUIT_TEST_PG_URL", "postgresql://root@/postgres?host=/var/run/postgresql"
)
T0 = 1_700_000_000_000
ACTIVE_WORK = 200
BATCH = 50


def finished_rows(n: int) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """(work row, execution row) of ``n`` completed Work, one confirmed attempt each."""
    snap = snapshot()
    for i in range(n):
        work_id = f"done-{i:08}"
        work = Work(
            id=work_id, scope=f"scope-{i % 50}", binding="b", status=WorkStatus.COMPLETED,
            created_at_ms=T0 + i, updated_at_ms=T0 + i, last_attempt=1,
        )  # fmt: skip
        ex = Execution(
            id=f"{work_id}#1", work_id=work_id, attempt=1, status=ExecutionStatus.COMPLETED,
            snapshot=snap, scope=work.scope, exclusion_confirmed=True, started_at_ms=T0 + i,
            ended_at_ms=T0 + i + 5, segments=[Segment(epoch=1, started_at_ms=T0 + i,
                                                      ended_at_ms=T0 + i + 5)],
        )  # fmt: skip
        yield work_params(work), execution_params(ex)


_WORK_SQL = f"INSERT INTO conduit_work ({WORK_COLUMNS}) VALUES "
_EXEC_SQL = f"INSERT INTO conduit_execution ({EXECUTION_COLUMNS}) VALUES "


def bulk_load_sqlite(path: Path, n: int) -> None:
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    chunk: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []
    for pair in finished_rows(n):
        chunk.append(pair)
        if len(chunk) == 50_000:
            _flush_sqlite(conn, chunk)
    _flush_sqlite(conn, chunk)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()


def _flush_sqlite(conn: Any, chunk: list[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> None:
    conn.executemany(_WORK_SQL + WORK_MARKS, [w for w, _ in chunk])
    conn.executemany(_EXEC_SQL + "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [e for _, e in chunk])
    chunk.clear()


def bulk_load_postgres(url: str, n: int) -> None:
    import psycopg

    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with (
            cur.copy(f"COPY conduit_work ({WORK_COLUMNS}) FROM STDIN") as work_copy,
        ):  # fmt: skip
            executions = []
            for work, ex in finished_rows(n):
                work_copy.write_row(work)
                executions.append(ex)
        with cur.copy(
            f"COPY conduit_execution ({EXECUTION_COLUMNS}) FROM STDIN"
        ) as exec_copy:
            for ex in executions:
                exec_copy.write_row(ex)
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


async def measure(url: str, attempts: int, run: int) -> float:
    """Attempts (claim + completion) per second over ``attempts`` attempts."""
    store = await open_store(url)
    try:
        await store.list_work(limit=1)  # warm the connection up
        for i in range(ACTIVE_WORK):
            # Work is claimable only with pending input: each attempt consumes one, and each
            # completion is followed by the Work's next input (timed on both stores alike).
            await store.create_work(
                make_work(f"active-{run}-{i:04}", scope=f"scope-{i % 50}"),
                first_input=make_input(f"active-{run}-{i:04}/0"),
            )
        claimed = await store.claim_ready(
            limit=ACTIVE_WORK, snapshot_for=lambda w: None, owner="bench", now_ms=T0,
            lease_ms=60_000,
        )  # fmt: skip
        assert all(not isinstance(c, Claim) for c in claimed)
        snap = snapshot()
        done = 0
        now = T0 + 10**9
        end = AttemptEnd(status=ExecutionStatus.COMPLETED, exclusion_confirmed=True)

        def ready(w: Work) -> Work:
            return msgspec.structs.replace(w, status=WorkStatus.READY)

        started = time.perf_counter()
        while done < attempts:
            now += 1
            batch = await store.claim_ready(
                limit=BATCH, snapshot_for=lambda w: snap, owner="bench", now_ms=now,
                lease_ms=60_000,
            )  # fmt: skip
            claims = [c for c in batch if isinstance(c, Claim)]
            assert claims, "no ready work to claim"
            for claim in claims:
                await store.finish_attempt(claim.lease, end, now_ms=now, work=ready)
                await store.accept_event(make_input(claim.execution.id, claim.execution.work_id))
            done += len(claims)
        return done / (time.perf_counter() - started)
    finally:
        await store.aclose()


def fresh_sqlite(directory: Path, name: str) -> str:
    return f"sqlite://{directory / name}"


class _PgDatabase:
    def __init__(self) -> None:
        self.name = f"conduit_bench_{uuid.uuid4().hex[:10]}"
        self.url = urlunsplit(urlsplit(PG_URL)._replace(path=f"/{self.name}"))

    def __enter__(self) -> str:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return self.url

    def __exit__(self, *exc: object) -> None:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


async def _prepare(url: str) -> None:
    store = await open_store(url)  # creates the schema before the bulk load
    assert isinstance(store, SqlStore)
    await store.aclose()


def best_of(runs: int, empty_url: str, big_url: str, attempts: int) -> tuple[float, float]:
    """Alternate the two stores so disk and CPU noise hits both alike; keep each one's best."""
    empty, big = 0.0, 0.0
    for run in range(runs):
        empty = max(empty, anyio.run(measure, empty_url, attempts, run))
        big = max(big, anyio.run(measure, big_url, attempts, run))
    return empty, big


def bench_backend(backend: str, rows: int, attempts: int, runs: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        if backend == "sqlite":
            empty_url = fresh_sqlite(Path(tmp), "empty.db")
            big_url = fresh_sqlite(Path(tmp), "big.db")
            anyio.run(_prepare, big_url)
            started = time.perf_counter()
            bulk_load_sqlite(Path(big_url[len("sqlite://") :]), rows)
            print(f"  loaded {rows:,} finished Work in {time.perf_counter() - started:.1f} s")
            return best_of(runs, empty_url, big_url, attempts)
        with _PgDatabase() as empty_url, _PgDatabase() as big_url:
            anyio.run(_prepare, big_url)
            started = time.perf_counter()
            bulk_load_postgres(big_url, rows)
            print(f"  loaded {rows:,} finished Work in {time.perf_counter() - started:.1f} s")
            return best_of(runs, empty_url, big_url, attempts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--attempts", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=3, help="alternating runs; best kept")
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    for backend in backends:
        print(f"{backend}:")
        empty, big = bench_backend(backend, args.rows, args.attempts, args.runs)
        print(f"  empty store:           {empty:8.0f} attempts/s (claim + completion)")
        print(f"  {args.rows:,} finished: {big:8.0f} attempts/s")
        print(f"  slowdown ratio:        {empty / big:8.2f}x  (target <= 1.3x)")


if __name__ == "__main__":
    main()
