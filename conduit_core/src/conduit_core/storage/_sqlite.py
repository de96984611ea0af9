"""SQLite backend: one file, WAL, ``BEGIN IMMEDIATE`` writes, busy retry with jitter."""

from __future__ import annotations

import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from conduit_core.errors import StoreError
from conduit_core.storage._schema import SCHEMA_VERSION, STORE_KIND
from conduit_core.storage._sql import Cx, Row, SetWrite, migrate, newer_schema_error
from conduit_core.storage._sqlstore import SqlStore
from conduit_core.telemetry import METRICS

__all__ = ["SqliteStore"]

T = TypeVar("T")
_HEADER = b"SQLite format 3\x00"
_ROW_LOCK = re.compile(r" FOR UPDATE(?: OF \w+)?(?: SKIP LOCKED)?")


@lru_cache(maxsize=512)
def _sqlite_sql(sql: str) -> str:
    """SQLite has one writer at a time (``BEGIN IMMEDIATE``): row-lock clauses are moot."""
    return _ROW_LOCK.sub("", sql)


class _SqliteCx:
    __slots__ = ("conn", "counter_locks")
    #: One writer by nature: nothing to lock row by row (see ``Cx.locks_rows``).
    locks_rows = False
    has_sequences = False
    has_arrays = False
    #: Nothing is read ahead on SQLite (see ``Cx.works_written``).
    works_written: set[str] | None = None

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.counter_locks: set[str] = set()  # kept for the protocol: nothing is row-locked

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        return self.conn.execute(_sqlite_sql(sql), params).fetchall()

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        self.conn.execute(sql, params)

    def defer(self, write: SetWrite, params: tuple[Any, ...]) -> None:
        self.conn.execute(write.one, params)  # in process: nothing to save by holding it

    def count(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        return self.conn.execute(sql, params).rowcount

    count_or_restart = count  # the commit costs no round trip here

    def count_later(self, sql: str, params: tuple[Any, ...] = ()) -> Callable[[], int]:
        changed = self.count(sql, params)  # in process: no round trip to save
        return lambda: changed

    def later(self, sql: str, params: tuple[Any, ...] = ()) -> Callable[[], list[Row]]:
        found = self.rows(sql, params)  # in process: no round trip to save
        return lambda: found

    def many(self, sql: str, params: list[tuple[Any, ...]]) -> None:
        self.conn.executemany(sql, params)


class SqliteStore(SqlStore):
    """The embedded default store: a single SQLite file shared safely by several processes.

    Writes take the database's write lock up front (``BEGIN IMMEDIATE``), so every write
    transaction is serial. A busy database is retried with jittered back-off until
    ``busy_budget_s`` of wall-clock time has passed.
    """

    def __init__(
        self, path: str | Path, *, busy_budget_s: float = 30.0, synchronous: str = "FULL"
    ) -> None:
        """Use :meth:`open` (or ``open_store``), which checks and migrates the file first."""
        self.path = Path(path)
        # Two threads: the writer, and a reader on a connection of its own, so a read never
        # waits behind a write batch's disk sync (WAL readers see the last commit), and a
        # write batch never waits for a thread while reads queue for the one reader.
        super().__init__(f"sqlite://{self.path}", threads=1, read_threads=1)
        self.busy_budget_s = busy_budget_s
        self._lock = threading.Lock()
        self._conn = _connect(self.path)
        self._cx = _SqliteCx(self._conn)
        self._read_lock = threading.Lock()
        self._reader: _SqliteCx | None = None  # opened at the first read
        self._retry(lambda: self._conn.execute("PRAGMA journal_mode=WAL").fetchall())
        self._conn.execute(f"PRAGMA synchronous={synchronous}")

    @classmethod
    def open(cls, path: str | Path, **options: Any) -> SqliteStore:
        """Open (creating if missing) a conduit store; refuse foreign, corrupt or newer files."""
        path = single_root(Path(path))
        inspect_file(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _create_private(path)
        store = cls(path, **options)
        try:
            store.transaction(lambda cx: migrate(cx, store.url))
        except BaseException:
            store.close()
            raise
        return store

    def transaction(
        self,
        fn: Callable[[Cx], T],
        *,
        write: bool = True,
        shared: bool = False,
        alone: bool = False,
    ) -> T:
        # ``shared`` and ``alone`` change nothing here: SQLite runs one writer at a time by
        # nature, and a commit is no round trip.
        begin = "BEGIN IMMEDIATE" if write else "BEGIN"

        def attempt() -> T:
            with self._lock if write else self._read_lock:
                cx = self._cx if write else self._reading()
                conn = cx.conn
                conn.execute(begin)
                try:
                    result = fn(cx)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return result

        return self._retry(attempt)

    def _reading(self) -> _SqliteCx:
        if self._reader is None:
            reader = _connect(self.path)
            reader.execute("PRAGMA query_only=1")  # a read transaction never writes
            self._reader = _SqliteCx(reader)
        return self._reader

    def _retry(self, attempt: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.busy_budget_s
        tries = 0
        while True:
            try:
                return attempt()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise _store_error(self.url, exc) from exc
                METRICS.store_retry("busy")
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"store {self.url} stayed busy for {self.busy_budget_s:g} s",
                        code="store_busy",
                    ) from exc
            except sqlite3.DatabaseError as exc:
                raise _store_error(self.url, exc) from exc
            tries += 1
            time.sleep(min(0.002 * 2 ** min(tries, 6), 0.1) * random.uniform(0.5, 1.5))

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        self._threads.stop()
        self._read_threads.stop()
        with self._lock:
            self._conn.close()
        with self._read_lock:
            if self._reader is not None:
                self._reader.conn.close()


def _connect(path: Path) -> sqlite3.Connection:
    """A connection of the store (the writer's or the reader's), in autocommit."""
    conn = sqlite3.connect(path, timeout=0.05, isolation_level=None, check_same_thread=False)
    # A large store must keep its hot index pages in memory for claims to stay flat.
    conn.execute("PRAGMA cache_size=-65536")
    return conn


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _store_error(url: str, exc: sqlite3.DatabaseError) -> StoreError:
    text = str(exc)
    if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in text:
        # SQLite rolls the transaction back whole: the file stays intact, nothing was written.
        return StoreError(
            f"store {url}: no space left on its device ({text}); the write was rolled back, "
            f"nothing was stored; free space and it continues",
            code="store_full",
        )
    if "not a database" in text or "malformed" in text:
        return StoreError(f"store {url} is corrupt: {text}", code="store_corrupt")
    return StoreError(f"store {url}: {text}")


def single_root(path: Path) -> Path:
    """``//abs/x.db`` (from ``sqlite:////abs/x.db``, SQLAlchemy's spelling) as ``/abs/x.db``.

    POSIX keeps a leading ``//`` in a path, and SQLite's ``file:`` URI then reads ``abs`` as
    an authority: the healthy store would be refused as corrupt on its second open.
    """
    text = str(path)
    return Path("/" + text.lstrip("/")) if text.startswith("//") else path


def _create_private(path: Path) -> None:
    """Create a missing store file 0600: it holds every payload. SQLite gives its -wal and
    -shm files the main file's mode, so they are private too."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise StoreError(f"store {path} cannot be created: {exc.strerror}") from exc
    os.close(fd)


def inspect_file(path: Path) -> None:
    """Refuse a file that is not a conduit store of this or an older version, writing nothing."""
    path = single_root(path)
    if not path.exists():
        return
    if path.is_dir():
        raise StoreError(f"store path {path} is a directory", code="store_corrupt")
    with path.open("rb") as fh:
        header = fh.read(len(_HEADER))
    if not header:
        return  # an empty file: SQLite treats it as a new database
    if header != _HEADER:
        raise StoreError(
            f"store {path} is not a conduit store: not an SQLite database (nothing was written)",
            code="store_corrupt",
        )
    # Without a WAL file the main file is the whole database: read it as immutable, which
    # creates no -wal/-shm files. With one, a read-only open finds the -shm it needs.
    wal = path.with_name(path.name + "-wal")
    flags = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(f"file:{quote(str(path))}?{flags}", uri=True, timeout=5.0)
    except sqlite3.Error as exc:
        raise StoreError(f"store {path} cannot be opened: {exc}", code="store_corrupt") from exc
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "conduit_meta" not in tables:
            if tables:
                names = ", ".join(sorted(tables)[:5])
                raise StoreError(
                    f"store {path} is not a conduit store: it is an SQLite database with other "
                    f"tables ({names}) (nothing was written)",
                    code="foreign_store",
                )
            return
        meta = dict(conn.execute("SELECT key, value FROM conduit_meta").fetchall())
        if meta.get("store_kind", STORE_KIND) != STORE_KIND:
            raise StoreError(f"store {path} is not a conduit store", code="foreign_store")
        version = int(meta.get("schema_version", 0))
        if version > SCHEMA_VERSION:
            raise newer_schema_error(str(path), version)
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"store {path} is corrupt: {exc} (nothing was written)", code="store_corrupt"
        ) from exc
    finally:
        conn.close()
