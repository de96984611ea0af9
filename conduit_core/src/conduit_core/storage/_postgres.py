"""PostgreSQL backend: concurrent row-locked writers, snapshot readers, pooled psycopg.

Isolation (see docs/architecture.md, "PostgreSQL: which lock keeps which invariant"):

- Every **write** transaction begins ``READ COMMITTED`` and, before any other statement, takes the
  store's transaction-scoped advisory lock ``_WRITE_LOCK``: **shared** for the row-locked
  operations (claims, fenced attempt writes, recovery claims, accepting input, firing timers —
  the hot path), **exclusive** for every other write. Row-locked operations run concurrently,
  across processes and hosts; each keeps its invariants with the row locks and constraints
  documented per invariant (the Work row, the attempt row, a capacity row per limited pool or
  scope, ``SKIP LOCKED`` for ready Work, unique indexes). An exclusive writer still runs alone,
  so an operation not yet converted keeps the serial execution it was written for.
  PostgreSQL releases the lock only after the commit is durable and visible.
- READ COMMITTED takes a fresh snapshot per statement; a statement that waited for a row lock
  re-reads the locked row's newest version (and rechecks its ``WHERE``). So every decision is
  made on rows read *after* their lock was granted, by a statement of its own: no lost update,
  no stale read of a locked row, whatever committed meanwhile.
- A **read** transaction is ``REPEATABLE READ READ ONLY``: one snapshot, no locks, never blocks
  or aborts a writer. A read only informs; whatever it suggests is re-checked by the write.

SERIALIZABLE (SSI) was tried first; its page-level predicate locks on these small, hot tables
aborted most concurrent claims as pivots, and the retries cost more than serializing.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from conduit_core.errors import StoreError
from conduit_core.storage import _pg_statistics
from conduit_core.storage._pipeline import Pipeline, Result, forget_prepared
from conduit_core.storage._schema import SCHEMA_VERSION
from conduit_core.storage._sql import (
    Cx,
    Row,
    SetWrite,
    migrate,
    newer_schema_error,
    write_rows,
)
from conduit_core.storage._sqlstore import SqlStore
from conduit_core.telemetry import METRICS

log = logging.getLogger("conduit.store")

__all__ = ["PostgresStore"]

T = TypeVar("T")
_MIGRATION_LOCK = 0x636F6E64  # "cond": serialises migrations of concurrent openers
# "conw": the writers' lock. Row-locked operations (see ``SqlStore.ROW_LOCKED``) take it SHARED,
# so they run concurrently and keep their invariants with row locks; every other write takes it
# EXCLUSIVE and so still runs alone, as in a serial execution.
_WRITE_LOCK = 0x636F6E77
# Begin, then take the writers' lock before any snapshot of the transaction is taken (both are
# queued in the pipeline and go with the transaction's first read).
_BEGIN_WRITE = (
    "BEGIN ISOLATION LEVEL READ COMMITTED",
    f"SELECT pg_advisory_xact_lock({_WRITE_LOCK})",
)
_BEGIN_SHARED = (
    "BEGIN ISOLATION LEVEL READ COMMITTED",
    f"SELECT pg_advisory_xact_lock_shared({_WRITE_LOCK})",
)
# Far above any transaction of ours (milliseconds between statements), far below a lease.
_IDLE_IN_TRANSACTION_MS = 10_000
_BEGIN_READ = ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",)
# Contention the database resolves by aborting one transaction; the whole transaction is rerun.
# With writers serialized these no longer arise between conduit's own transactions; they are
# kept for a database shared with other clients and for lost connections mid-batch.
#: The errors that roll a transaction back to be run again, by their reason in
#: ``conduit_store_retries_total``.
_RETRIED_BECAUSE: dict[type[psycopg.Error], str] = {
    psycopg.errors.SerializationFailure: "serialization",
    psycopg.errors.DeadlockDetected: "deadlock",
    # A counter row wanted out of order, held past ``_sql.OUT_OF_ORDER_WAIT_MS`` by another
    # transaction (``lock_counter_rows``).
    psycopg.errors.LockNotAvailable: "lock_order",
    psycopg.errors.UniqueViolation: "unique_violation",
    # The connection's prepared statements were dropped (see ``_pipeline.forget_prepared``).
    psycopg.errors.InvalidSqlStatementName: "statement_dropped",
}
_RETRYABLE = tuple(_RETRIED_BECAUSE)


def _retry_reason(exc: BaseException) -> str:
    return next((why for kind, why in _RETRIED_BECAUSE.items() if isinstance(exc, kind)), "other")


@lru_cache(maxsize=512)
def _pg_sql(sql: str) -> str:
    return sql.replace("?", "%s")


class _PgCx:
    """A transaction's statements. With ``begin`` they are sent pipelined (``_run``; see
    ``_pipeline``): a statement whose outcome nobody reads (``run``, ``many``) is queued and
    goes to the server with the next one that returns something (``rows``, ``count``, a
    ``later`` read taken) or with the ``COMMIT``. A transaction costs a round trip per read it
    waits for, plus one for its commit. Deferred writes (``defer``) are held until the next
    other statement or the commit, then sent kind by kind (``write_rows``:
    ``ONE_STATEMENT_FROM`` or more rows of a kind as one statement). Without ``begin``
    (migrations, ``_OneStatementCx``) each statement goes on its own through psycopg's cursor."""

    __slots__ = (
        "_alone", "_begin", "_conn", "_cur", "_deferred", "_pipe", "committed", "counter_locks",
        "works_written",
    )  # fmt: skip
    locks_rows = True
    has_sequences = True
    has_arrays = True

    def __init__(
        self,
        cur: psycopg.Cursor[Any],
        *,
        begin: tuple[str, ...] | None = None,
        alone: bool = False,
    ) -> None:
        self._conn = cur.connection
        self._cur = cur
        #: ``None``: statements are sent one by one, outside any pipeline.
        self._begin = begin
        #: The operation is alone in its transaction (``count_or_restart`` may commit it).
        self._alone = alone
        self._pipe: Pipeline | None = None
        #: The transaction committed with ``count_or_restart``: nothing more may be sent.
        self.committed = False
        self.works_written: set[str] | None = None
        self.counter_locks: set[str] = set()
        #: Writes held back (``defer``), per kind, each row's parameters in the order deferred.
        self._deferred: dict[SetWrite, dict[Any, tuple[Any, ...]]] = {}
        if begin is not None:
            self._open()

    def _open(self) -> None:
        """Enter pipeline mode and queue the transaction's ``BEGIN`` (and the writers' lock)."""
        assert self._begin is not None
        pipe = self._pipe = Pipeline(self._conn)
        try:
            for statement in self._begin:
                pipe.send(statement)
        except BaseException as exc:
            self.abandon(exc)  # leave pipeline mode now: the pool must get the connection clean
            raise

    def _leave(self) -> None:
        """Leave pipeline mode: what is queued is sent, every result taken (one round trip);
        an error of any statement sent is raised here."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close()

    def commit(self) -> None:
        if not self.committed:
            if self._deferred:
                self._send_deferred()
            self._send("COMMIT", ())
            self._leave()

    def abandon(self, exc: BaseException) -> None:
        """Leave a failed transaction's pipeline (its results, errors included, discarded)."""
        pipe, self._pipe = self._pipe, None
        self._deferred.clear()
        if pipe is not None:
            with contextlib.suppress(psycopg.Error):
                pipe.close(discard=True)
        conn = self._conn
        if not conn.closed and conn.pgconn.pipeline_status != PipelineStatus.OFF:
            conn.close()  # results left unread (a lost connection, say): never reuse it

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        if self._pipe is None:
            self._execute(sql, params)
            return self._cur.fetchall()
        return self._pipe.rows(self._send(sql, params))  # sends what is queued, waits for it

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        self._execute(sql, params)

    def defer(self, write: SetWrite, params: tuple[Any, ...]) -> None:
        if self._pipe is None:  # no commit of ours to send it with (a migration, say)
            self._execute(write.one, params)
            return
        held = self._deferred.setdefault(write, {})
        row = params[write.key]
        if row in held:  # the same row again: the first write goes first
            self._send_deferred()
            held = self._deferred.setdefault(write, {})
        held[row] = params

    def _send_deferred(self) -> None:
        """Send the held writes, kind by kind in the order first deferred (``Cx.defer``)."""
        deferred, self._deferred = self._deferred, {}
        for write, held in deferred.items():
            write_rows(self, write, list(held.values()))

    def count(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        if self._pipe is None:
            self._execute(sql, params)
            return self._cur.rowcount
        return self._pipe.count(self._send(sql, params))

    def count_or_restart(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        pipe = self._pipe
        if not self._alone or pipe is None:
            return self.count(sql, params)
        # The statement and the COMMIT are sent with leaving the pipeline: one round trip. An
        # error in the statement makes the server skip the COMMIT: the transaction fails as
        # any other.
        result = self._send(sql, params)
        self._send("COMMIT", ())
        self._leave()
        changed = pipe.count(result)
        if changed:
            self.committed = True
        else:  # nothing was written: the operation goes on in a fresh transaction
            self._open()
        return changed

    def many(self, sql: str, params: list[tuple[Any, ...]]) -> None:
        self._execute(sql, params, many=True)

    def count_later(self, sql: str, params: tuple[Any, ...] = ()) -> Callable[[], int]:
        pipe = self._pipe
        if pipe is None:
            changed = self.count(sql, params)
            return lambda: changed
        return partial(pipe.count, self._send(sql, params))

    def later(self, sql: str, params: tuple[Any, ...] = ()) -> Callable[[], list[Row]]:
        pipe = self._pipe
        if pipe is None:
            found = self.rows(sql, params)
            return lambda: found
        return partial(pipe.rows, self._send(sql, params))

    def _send(self, sql: str, params: Any) -> Result:
        result = self._execute(sql, params)
        assert result is not None, "only a pipelined transaction sends statements to take later"
        return result

    def _execute(self, sql: str, params: Any, *, many: bool = False) -> Result | None:
        """Every statement goes here: queued in the pipeline (its ``Result``, but ``many``'s),
        or, outside one, executed by psycopg's cursor (``None``)."""
        if self.committed:
            raise RuntimeError(f"a statement after the operation committed: {sql[:60]}")
        if self._deferred:
            self._send_deferred()
        pipe = self._pipe
        if pipe is not None:
            if not many:
                return pipe.send(sql, params)
            for row in params:
                pipe.send(sql, row)
        elif many:
            self._cur.executemany(_pg_sql(sql), params)
        else:
            self._cur.execute(_pg_sql(sql), params)
        return None


class _OneStatementCx(_PgCx):
    """A read outside any transaction block: allowed one statement (its own snapshot)."""

    __slots__ = ("_used",)

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        super().__init__(cur)
        self._used = False

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        if self._used or not sql.lstrip().upper().startswith("SELECT"):
            raise RuntimeError(f"a single-statement read ran a second statement: {sql[:60]}")
        self._used = True
        return super().rows(sql, params)

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        raise RuntimeError(f"a single-statement read tried to write: {sql[:60]}")

    def count(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        raise RuntimeError(f"a single-statement read tried to write: {sql[:60]}")

    def many(self, sql: str, params: list[tuple[Any, ...]]) -> None:
        raise RuntimeError(f"a single-statement read tried to write: {sql[:60]}")

    def later(self, sql: str, params: tuple[Any, ...] = ()) -> Callable[[], list[Row]]:
        found = self.rows(sql, params)
        return lambda: found


class PostgresStore(SqlStore):
    """The multi-host store: row-locked writers run concurrently (see the module), readers on a
    snapshot."""

    def __init__(
        self,
        conninfo: str,
        *,
        masked_url: str,
        pool_size: int = 8,
        parallel_batches: int = 2,
        retry_budget_s: float = 30.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        """Use :meth:`open` (or ``open_store``), which checks and migrates the database first."""
        super().__init__(masked_url, threads=pool_size, parallel_batches=parallel_batches)
        self.retry_budget_s = retry_budget_s
        self._wait_s = connect_timeout_s * 2
        # Set while the server does not answer: callers then wait at most a second for a
        # connection instead of the full pool timeout, so the API answers 503 promptly and the
        # host loop's backoff, not the pool's wait, paces the retries.
        self._unreachable = False
        self._new_pool = partial(
            ConnectionPool,
            conninfo,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "connect_timeout": max(int(connect_timeout_s), 1)},
            timeout=connect_timeout_s * 2,
            configure=_configure,
            open=True,
        )
        self._conninfo = conninfo
        self._pool: ConnectionPool[Any] = self._new_pool()
        self._pool_lock = threading.Lock()

    @classmethod
    def open(cls, conninfo: str, *, masked_url: str, **options: Any) -> PostgresStore:
        """Connect, refuse a newer schema (writing nothing), apply forward migrations."""
        connect_timeout = options.get("connect_timeout_s", 5.0)
        try:
            conn = psycopg.connect(conninfo, connect_timeout=max(int(connect_timeout), 1))
        except psycopg.Error as exc:
            raise StoreError(
                f"store {masked_url} is unreachable: {str(exc).strip()}", code="store_unreachable"
            ) from exc
        with conn:
            version = _stored_version(conn)
            if version is not None and version > SCHEMA_VERSION:
                raise newer_schema_error(masked_url, version)
            if version != SCHEMA_VERSION:
                with conn.transaction():
                    cur = conn.cursor()
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                    migrate(_PgCx(cur), masked_url)
        return cls(conninfo, masked_url=masked_url, **options)

    def transaction(
        self,
        fn: Callable[[Cx], T],
        *,
        write: bool = True,
        shared: bool = False,
        alone: bool = False,
    ) -> T:
        begin = (_BEGIN_SHARED if shared else _BEGIN_WRITE) if write else _BEGIN_READ
        return self._retried(partial(_run, fn=fn, begin=begin, alone=alone))

    async def refresh_statistics(self) -> list[str]:
        return await self._read_threads.run(partial(self._retried, _pg_statistics.refresh))

    def read_statement(self, fn: Callable[[Cx], T]) -> T:
        """One SELECT in autocommit: a single statement is its own consistent snapshot, the
        same as a one-statement REPEATABLE READ READ ONLY transaction, in one round trip
        instead of three (``_OneStatementCx`` refuses a second statement or a write)."""
        return self._retried(lambda conn: fn(_OneStatementCx(conn.cursor())))

    def _retried(self, run: Callable[[psycopg.Connection[Any]], T]) -> T:
        deadline = time.monotonic() + self.retry_budget_s
        tries = 0
        while True:
            pool = self._pool
            if self._unreachable and tries == 0 and self._renewed_when_back(pool):
                # The server answers again: a fresh pool connects at once, where waiting on the
                # old one would cost its 1 s timeout first (its own reconnect backoff is longer).
                pool = self._pool
            try:
                with pool.connection(timeout=1.0 if self._unreachable else self._wait_s) as conn:
                    result = run(conn)
                self._unreachable = False
                return result
            except _RETRYABLE as exc:
                METRICS.store_retry(_retry_reason(exc))
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"store {self.url}: transaction kept conflicting for "
                        f"{self.retry_budget_s:g} s: {exc}",
                        code="store_busy",
                    ) from exc
            except PoolClosed:
                if self._pool is pool:
                    raise
                continue  # renewed meanwhile (``_renewed_when_back``): try the new pool
            except PoolTimeout as exc:
                self._unreachable = True
                if tries == 0 and self._renewed_when_back(pool):
                    tries += 1
                    continue
                raise StoreError(
                    f"store {self.url} is unreachable: {exc}", code="store_unreachable"
                ) from exc
            except psycopg.errors.DiskFull as exc:
                raise StoreError(
                    f"store {self.url}: the server has no space left ({exc}); the transaction "
                    f"was rolled back, nothing was stored",
                    code="store_full",
                ) from exc
            except psycopg.OperationalError as exc:
                self._unreachable = True
                raise StoreError(f"store {self.url}: {exc}", code="store_unavailable") from exc
            tries += 1
            time.sleep(min(0.001 * 2 ** min(tries, 7), 0.1) * random.uniform(0.5, 1.5))

    def _renewed_when_back(self, pool: ConnectionPool[Any]) -> bool:
        """After an outage, whether the server answers again while the pool still has no
        connection for us; if so the pool is replaced by a fresh one.

        The pool reconnects on a backoff of its own (1, 2, 4, 8 s…), so after a 10 s outage
        it would try again only some 5 s after the server is back, and the daemon would sit
        idle that long. One direct connection attempt (at most a second) tells whether the
        server answers; a fresh pool connects at once. Connections checked out of the old pool
        are closed as they are given back.
        """
        if self._pool is not pool:
            return True  # another call renewed it meanwhile
        try:
            psycopg.connect(self._conninfo, connect_timeout=1).close()
        except psycopg.Error:
            return False
        with self._pool_lock:
            if self._pool is not pool:
                return True
            self._pool = self._new_pool()
        pool.close(timeout=0)
        log.info("store %s answers again: connection pool renewed", self.url)
        return True

    async def aclose(self) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.close)

    def close(self) -> None:
        self._threads.stop()
        self._pool.close()


def _configure(conn: psycopg.Connection[Any]) -> None:
    # A client stopped inside a write transaction (SIGSTOP, a frozen VM) would hold the writers'
    # advisory lock, and so stop every daemon sharing the store, for as long as it stays stopped.
    # The server ends such a session instead; its transaction rolls back (nothing half-written),
    # and the stopped client, if it resumes, gets a lost connection, never a stale write.
    conn.execute(f"SET idle_in_transaction_session_timeout = {_IDLE_IN_TRANSACTION_MS}")
    # The hot partial indexes (slot holders, claimable Work) gain an entry per attempt and lose
    # it at once, but the entry stays, dead, until a vacuum. A bitmap scan never marks dead
    # entries, so every capacity count and every ready-Work read would visit the heap page of
    # each attempt settled since the last vacuum (~1 ms per claim after a few thousand, and
    # growing); a plain index scan marks them and later scans skip them (tens of microseconds).
    # Nothing conduit reads needs a bitmap scan: every query is by key or by index order.
    conn.execute("SET enable_bitmapscan = off")
    # Every statement here is short: by key or by index order, rows in the tens. The planner
    # cannot know a claim's row count (its ``LIMIT`` is the free slots, counted by the statement
    # itself) and takes a tenth of the ready queue, so under a backlog of ~10,000 the claim's
    # estimated cost passes ``jit_above_cost`` and every claim compiled its plan first: ~35 ms
    # to run a 0.1 ms read, while holding the limit's lock every other claim waits on (a 30,000
    # backlog drained at ~10 jobs/s for 10-15 s). Nothing conduit sends gains from JIT.
    conn.execute("SET jit = off")


def _run(
    conn: psycopg.Connection[Any], fn: Callable[[Cx], T], begin: tuple[str, ...], alone: bool
) -> T:
    """One transaction on an autocommit connection: ``begin``, ``fn``, then commit, pipelined
    (see ``_PgCx``): the outcome is the same as sending each statement and waiting for it, as
    the server runs them in order and stops at the first error, which is raised here."""
    cx = _PgCx(conn.cursor(), begin=begin, alone=alone)
    try:
        try:
            result = fn(cx)
            cx.commit()
        except BaseException as exc:
            cx.abandon(exc)
            raise
    except BaseException:
        if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
            conn.rollback()
            forget_prepared(conn)  # psycopg's rollback may have deallocated them all
        raise
    return result


def _stored_version(conn: psycopg.Connection[Any]) -> int | None:
    try:
        row = conn.execute("SELECT to_regclass('conduit_meta') IS NOT NULL").fetchone()
        if not row or not row[0]:
            return None
        sql = "SELECT value FROM conduit_meta WHERE key = 'schema_version'"
        found = conn.execute(sql).fetchone()
        return None if found is None else int(found[0])
    finally:
        conn.rollback()  # read only: the migration, if any, runs in its own transaction
