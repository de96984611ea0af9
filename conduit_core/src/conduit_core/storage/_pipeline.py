"""A write transaction's statements over libpq's pipeline mode, below psycopg's cursors.

psycopg's cursor layer costs ~20 µs of client CPU per statement in a pipeline (query
conversion, the prepared-statement cache, result bookkeeping, generators per statement); libpq
itself ~5 µs. A PostgreSQL attempt sends ~13 statements at concurrency 4, all on this path, so
the layer cost more CPU than the rest of the store's work together (see bench/README, "December,
eighth pass"). ``Pipeline`` keeps what psycopg does that matters here, with its own parts:

- parameters dumped by psycopg's ``Transformer`` (the same dumpers and type OIDs psycopg uses:
  ``?`` and ``%s`` in automatic format, ``%b`` in binary);
- every statement prepared once per connection and types (as psycopg's automatic preparation,
  but from the first use), under names of its own (``_conduit_N``);
- results loaded by the same ``Transformer`` into tuples; errors raised as psycopg raises them
  (``error_from_result``), the first one of a pipeline at its sync.

Only ``_PgCx`` uses it, for the statements of a transaction it runs pipelined; a connection
leaves the pipeline (``close``) with every result taken, as psycopg's own pipeline leaves it.
"""

from __future__ import annotations

import itertools
import re
import weakref
from collections import deque
from collections.abc import Callable, Generator, Sequence
from functools import lru_cache, partial
from typing import Any

import psycopg
import psycopg.errors
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.waiting import Ready, Wait

__all__ = ["Pipeline", "Result", "forget_prepared"]

_FATAL = pq.ExecStatus.FATAL_ERROR
_ABORTED = pq.ExecStatus.PIPELINE_ABORTED
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_READABLE = Ready.R
_PLACEHOLDER = re.compile(r"\?|%s|%b")


@lru_cache(maxsize=512)
def parse(sql: str) -> tuple[bytes, tuple[PyFormat, ...]]:
    """``sql`` with numbered placeholders, and each parameter's format (``%b``: binary)."""
    formats: list[PyFormat] = []

    def number(match: re.Match[str]) -> str:
        formats.append(PyFormat.BINARY if match.group() == "%b" else PyFormat.AUTO)
        return f"${len(formats)}"

    return _PLACEHOLDER.sub(number, sql).encode(), tuple(formats)


#: A statement as prepared: its query and its parameters' type OIDs.
_Key = tuple[bytes, tuple[int, ...]]

#: Statement names are never reused, on any connection: one forgotten (``forget_prepared``)
#: while the server still has it cannot collide with its successor.
_NAME_NUMBERS = itertools.count(1)


#: Per connection, the statements prepared on it and their names.
_PREPARED: weakref.WeakKeyDictionary[psycopg.Connection[Any], dict[_Key, bytes]] = (
    weakref.WeakKeyDictionary()
)


def forget_prepared(conn: psycopg.Connection[Any]) -> None:
    """The server may have dropped ``conn``'s prepared statements (psycopg's ``rollback`` ends
    with ``DEALLOCATE ALL`` once psycopg has prepared any of its own): prepare them again, under
    new names (a statement it kept stays until the connection closes)."""
    _PREPARED.pop(conn, None)


class Result:
    """A statement's outcome, once its pipeline has been synced."""

    __slots__ = ("pgresult",)

    def __init__(self) -> None:
        self.pgresult: pq.abc.PGresult | None = None


class _Prepare:
    """A ``PREPARE`` in flight: forgotten again unless the server confirms it."""

    __slots__ = ("key", "names")

    def __init__(self, names: dict[_Key, bytes], key: _Key) -> None:
        self.names = names
        self.key = key


def _exchange(
    pg: pq.abc.PGconn, commands: deque[Callable[[], None]]
) -> Generator[Wait, Ready | int, list[list[pq.abc.PGresult]]]:
    """Send every command (the last a sync), then take in every result set up to that sync
    (psycopg's ``wait`` drives it: it yields what to wait for, and is sent what is ready).

    psycopg's ``pipeline_communicate`` waits on the socket once per command sent, and
    ``fetch_many`` takes one statement's results per ``wait`` (18 per attempt at concurrency 4).
    Here the commands go into libpq's buffer together and every result is read in this one
    ``wait``, which waits only when the socket makes it: a flush that would block (reading
    when readable, as libpq's own flush does, so a server writing results never waits on us)
    and results not yet arrived."""
    while commands:
        commands.popleft()()
    while pg.flush():
        if (yield Wait.RW) & _READABLE:
            pg.consume_input()
    fetched: list[list[pq.abc.PGresult]] = []
    results: list[pq.abc.PGresult] = []
    while True:
        if pg.is_busy():
            while not (yield Wait.R):
                continue
            pg.consume_input()
            continue
        result = pg.get_result()
        if result is None:  # the end of one statement's result sets
            if results:
                fetched.append(results)
                results = []
        elif result.status == _SYNC:  # alone, and the last: no end follows it
            fetched.append([result])
            return fetched
        else:
            results.append(result)


class Pipeline:
    """One connection in pipeline mode: statements queued, sent and taken in at ``sync``."""

    __slots__ = ("_commands", "_conn", "_names", "_pending", "_pg", "_tx")

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._pg = conn.pgconn
        self._tx = Transformer(conn)
        self._names = _PREPARED.setdefault(conn, {})
        self._commands: deque[Callable[[], None]] = deque()
        #: What each result set still to come is for, in the order they come.
        self._pending: deque[Result | _Prepare | None] = deque()
        self._pg.enter_pipeline_mode()

    def send(self, sql: str, params: Sequence[Any] = ()) -> Result:
        """Queue ``sql`` (prepared on this connection at its first use); sent at ``sync``."""
        query, formats = parse(sql)
        tx = self._tx
        if params:
            values: Sequence[Any] | None = tx.dump_sequence(params, formats)
            types = tuple(tx.types or ())
            param_formats: Sequence[pq.Format] | None = list(tx.formats or ())
        else:
            values = param_formats = None
            types = ()
        key = (query, types)
        names = self._names
        name = names.get(key)
        if name is None:
            name = names[key] = b"_conduit_%d" % next(_NAME_NUMBERS)
            self._commands.append(
                partial(self._pg.send_prepare, name, query, param_types=types or None)
            )
            self._pending.append(_Prepare(names, key))
        result = Result()
        self._commands.append(
            partial(self._pg.send_query_prepared, name, values, param_formats=param_formats)
        )
        self._pending.append(result)
        return result

    def sync(self) -> None:
        """Send everything queued and take in every result so far; raise the first error."""
        pg = self._pg
        self._commands.append(pg.pipeline_sync)
        self._pending.append(None)
        error = self._take(self._conn.wait(_exchange(pg, self._commands)), None)
        if error is not None:
            raise error

    def _take(
        self, fetched: list[list[pq.abc.PGresult]], error: psycopg.Error | None
    ) -> psycopg.Error | None:
        for results in fetched:
            sink = self._pending.popleft()
            result = results[-1]
            status = result.status
            if status == _SYNC:
                continue
            if status == _FATAL and error is None:
                error = psycopg.errors.error_from_result(result, encoding=self._conn.info.encoding)
                if isinstance(error, psycopg.errors.InvalidSqlStatementName):
                    # Dropped behind our back (a ``DEALLOCATE ALL``): prepared again on the
                    # transaction's retry (the error is one ``PostgresStore`` retries).
                    self._names.clear()
            if isinstance(sink, _Prepare):
                if status in (_FATAL, _ABORTED):
                    sink.names.pop(sink.key, None)  # never prepared: prepare again
            elif sink is not None and status not in (_ABORTED, _FATAL):
                sink.pgresult = result
        return error

    def rows(self, result: Result) -> list[tuple[Any, ...]]:
        """The rows of a statement sent (synced first if its result is not in yet)."""
        res = self._taken(result)
        tx = self._tx
        tx.set_pgresult(res)
        return tx.load_rows(0, res.ntuples, tuple)

    def count(self, result: Result) -> int:
        """The rows a statement sent changed (synced first if its result is not in yet)."""
        changed = self._taken(result).command_tuples
        return -1 if changed is None else changed

    def _taken(self, result: Result) -> pq.abc.PGresult:
        if result.pgresult is None:
            self.sync()
        assert result.pgresult is not None
        return result.pgresult

    def close(self, *, discard: bool = False) -> None:
        """Leave pipeline mode, every result taken; ``discard``: their errors too (a failed
        transaction's, rolled back next)."""
        try:
            if self._pending or self._commands:
                try:
                    self.sync()
                except psycopg.Error:
                    if not discard:
                        raise
        finally:
            if self._pg.pipeline_status != pq.PipelineStatus.OFF and not self._pending:
                self._pg.exit_pipeline_mode()
