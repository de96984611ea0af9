"""Statements and transactions per attempt through the Scheduler: a count, not a timing.

    .venv/bin/python bench/bench_statements.py --store postgres --concurrency 4 64 --n 1000
    /work/base/.venv/bin/python bench/bench_statements.py ...   # another checkout: before/after

Runs ``bench_scheduler``'s workload (N no-op Work enqueued, then drained at the given
concurrency by a real Scheduler with the bundled plugins) and counts, while the attempts run
(the enqueue is not counted), the SQL statements the store sent (a batched ``executemany`` counts
once: one round trip) and the write and read transactions, per attempt, then the most frequent
statements. Unlike attempts/s, the figure does not depend on how loaded the machine is, so it
compares two checkouts exactly (it varies a little with how claims and writes happen to batch).
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import bench_scheduler
from bench_scheduler import fresh_url  # type: ignore[import-not-found]

_COUNTING = {"on": False}
_INSIDE = threading.local()  # a counted method calling another (count_or_restart -> count)
STATEMENTS: Counter[str] = Counter()
#: Round trips to the server: the times the client sent what it had and waited for an answer.
TRIPS: Counter[str] = Counter()
TRANSACTIONS: Counter[str] = Counter()


def _norm(sql: str) -> str:
    return re.sub(r"\s+", " ", sql.strip())[:100]


def _count_cx(cls: type[Any]) -> None:
    for name in ("rows", "run", "count", "count_or_restart", "count_later", "later", "many"):
        original = getattr(cls, name, None)
        if original is None:
            continue  # a checkout from before ``count`` (run returned the row count)

        def counted(self: Any, sql: str, params: Any = (), _o: Callable[..., Any] = original,
                    _many: bool = name == "many") -> Any:  # fmt: skip
            if not _COUNTING["on"] or getattr(_INSIDE, "on", False):
                return _o(self, sql, params)  # one method calling another: counted once
            STATEMENTS[("many: " if _many else "") + _norm(sql)] += 1
            _INSIDE.on = True
            try:
                return _o(self, sql, params)
            finally:
                _INSIDE.on = False

        setattr(cls, name, counted)
    _count_deferred(cls)


def _sql_threshold() -> int:
    from conduit_core.storage import _sql

    return int(_sql.ONE_STATEMENT_FROM)


def _count_deferred(cls: type[Any]) -> None:
    """Deferred writes (``Cx.defer``) count where they are sent: at once (SQLite), or when the
    held ones go (PostgreSQL), one statement for a kind's rows sent as one."""
    send = getattr(cls, "_send_deferred", None)
    if send is None:
        defer = getattr(cls, "defer", None)
        if defer is None:
            return  # a checkout from before ``defer``

        def deferred(self: Any, write: Any, params: Any, _o: Callable[..., Any] = defer) -> Any:
            if _COUNTING["on"] and not getattr(_INSIDE, "on", False):
                STATEMENTS[_norm(write.one)] += 1
            return _o(self, write, params)

        cls.defer = deferred
        return

    # The threshold: on the class in checkouts before it moved beside ``write_rows``.
    set_from = getattr(cls, "SET_FROM", None) or _sql_threshold()

    def sent(self: Any, _o: Callable[..., Any] = send) -> Any:
        if _COUNTING["on"]:
            for write, held in self._deferred.items():
                if len(held) >= set_from:
                    STATEMENTS[_norm(write.many)] += 1
                else:
                    STATEMENTS[_norm(write.one)] += len(held)
        return _o(self)

    cls._send_deferred = sent


def _count_transactions() -> None:
    from conduit_core.storage._sqlstore import SqlStore

    original = SqlStore._run_batch
    read = SqlStore._read
    read_one = SqlStore._read_one

    def run_batch(self: Any, ops: Any) -> None:
        if _COUNTING["on"]:
            TRANSACTIONS["write"] += 1
        original(self, ops)

    async def counted_read(self: Any, fn: Any, *args: Any) -> Any:
        if _COUNTING["on"]:
            TRANSACTIONS["read"] += 1
        return await read(self, fn, *args)

    async def counted_read_one(self: Any, fn: Any, *args: Any) -> Any:
        if _COUNTING["on"]:
            TRANSACTIONS["read (one statement)"] += 1
        return await read_one(self, fn, *args)

    SqlStore._run_batch = run_batch  # type: ignore[method-assign]
    SqlStore._read = counted_read  # type: ignore[method-assign]
    SqlStore._read_one = counted_read_one  # type: ignore[method-assign]


async def _process_counted(sched: Any, n: int, concurrency: int) -> int:
    _COUNTING["on"] = True
    try:
        return await _process(sched, n, concurrency)
    finally:
        _COUNTING["on"] = False


_process = bench_scheduler.process


def _count_round_trips() -> None:
    """A statement outside a pipeline is one round trip (``executemany`` too: psycopg pipelines
    it); inside one (issue 14), a sync, or a fetch that has to wait for its result, is one;
    in conduit's own pipeline (``storage/_pipeline.py``), a sync."""
    from psycopg import Cursor
    from psycopg._pipeline_base import BasePipeline

    def counting(original: Callable[..., Any], when: Callable[..., bool]) -> Callable[..., Any]:
        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _COUNTING["on"] and when(self, *args, **kwargs):
                TRIPS["trip"] += 1
            return original(self, *args, **kwargs)

        return counted

    def unpiped(cur: Any, *args: Any, **kwargs: Any) -> bool:
        return cur.connection._pipeline is None

    Cursor.execute = counting(Cursor.execute, unpiped)  # type: ignore[method-assign]
    Cursor.executemany = counting(Cursor.executemany, unpiped)  # type: ignore[method-assign]
    BasePipeline._sync_gen = counting(  # type: ignore[method-assign]
        BasePipeline._sync_gen, lambda pipeline: True
    )
    BasePipeline._fetch_gen = counting(  # type: ignore[method-assign]
        BasePipeline._fetch_gen, lambda pipeline, flush: flush and bool(pipeline.result_queue)
    )
    try:  # conduit's own pipeline (issue 14, below psycopg's cursors): each sync is one
        from conduit_core.storage._pipeline import Pipeline
    except ImportError:
        return  # a checkout from before it: psycopg's pipeline, counted above
    Pipeline.sync = counting(Pipeline.sync, lambda pipeline: True)  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--top", type=int, default=12, help="most frequent statements shown")
    args = parser.parse_args()
    if args.store == "sqlite":
        from conduit_core.storage._sqlite import _SqliteCx as cx_class
    else:
        from conduit_core.storage._postgres import _PgCx as cx_class
    _count_cx(cx_class)
    _count_transactions()
    if args.store == "postgres":
        _count_round_trips()
    bench_scheduler.process = _process_counted
    for concurrency in args.concurrency:
        STATEMENTS.clear()
        TRANSACTIONS.clear()
        TRIPS.clear()
        url, keep = fresh_url(args.store)
        try:
            anyio.run(bench_scheduler.bench_one, url, args.n, concurrency)
        finally:
            cleanup = getattr(keep, "cleanup", None)
            if cleanup:
                cleanup()
        per = {k: round(v / args.n, 2) for k, v in sorted(TRANSACTIONS.items())}
        print(
            f"{args.store:8} concurrency={concurrency:<3} n={args.n} "
            f"statements/attempt={sum(STATEMENTS.values()) / args.n:.2f} transactions/attempt={per}"
            + (f" round_trips/attempt={TRIPS['trip'] / args.n:.2f}" if TRIPS else "")
        )
        for sql, count in STATEMENTS.most_common(args.top):
            print(f"    {count / args.n:6.2f}  {sql}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
