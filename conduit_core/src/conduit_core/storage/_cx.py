"""One open transaction of a store, as the store's operations see it (``Cx``), and a write
that a backend with arrays may send for many rows at once (``SetWrite``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

__all__ = ["Cx", "Row", "SetWrite", "chunks"]

Row = tuple[Any, ...]


class SetWrite(NamedTuple):
    """A write of one row (``one``, ``?`` placeholders; the row's id is parameter ``key``) and
    the same write for many rows as one statement (``many``: one array per column, in binary,
    in the same order; see ``Cx.defer``)."""

    one: str
    many: str
    key: int = -1


class Cx(Protocol):
    """One open transaction. SQL uses ``?`` placeholders; a backend translates them.

    ``FOR UPDATE [OF t] [SKIP LOCKED]`` clauses lock rows where writers run concurrently
    (PostgreSQL); a backend with one writer at a time drops them and sets ``locks_rows`` false.
    """

    #: Whether concurrent writers exist, so invariants need row locks (see docs/architecture.md).
    locks_rows: bool
    #: Whether the backend has sequences (PostgreSQL): numbers taken without a row lock.
    has_sequences: bool
    #: Whether a parameter may be an array (PostgreSQL): a set-based statement then takes one
    #: array per column (``unnest``), so its text, and its prepared plan, fit any row count.
    has_arrays: bool
    #: While not ``None``, the ids of the Work rows this transaction has updated (every update
    #: goes through ``save_work`` or ``SAVE_WORK``): a batch that read rows ahead for its
    #: operations sets it, to know which of those reads a write has since made stale.
    works_written: set[str] | None
    #: The counter rows this transaction has locked (``lock_counter_rows``), by name.
    counter_locks: set[str]

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]: ...

    def defer(self, write: SetWrite, params: tuple[Any, ...]) -> None:
        """``run(write.one, params)``, except that a backend with arrays may hold it back and
        send the rows of one ``SetWrite`` held together as one statement (``write.many``). What
        is held goes before the transaction's next other statement and before its commit, each
        write's rows in the order deferred, so nothing the transaction reads or writes next can
        tell; only the row locks the writes take are taken that much later. So a caller defers
        only writes to rows it has already locked, or inserts of rows only it can insert."""
        ...

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        """Execute a statement whose outcome the caller does not read. A backend may send it
        with the next statement that returns something (PostgreSQL pipelines them), so its
        error may surface there or at commit: the transaction's error either way."""
        ...

    def count(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        """Execute a statement now and return its row count."""
        ...

    def count_or_restart(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        """``count`` for an operation's first statement, when that statement alone does the
        operation if it changes a row: a backend may then commit with it (one round trip for
        the whole transaction) and return its count; the operation issues nothing more. On a
        count of 0 nothing was written, and the operation goes on in a transaction that may be
        a fresh one (begun afresh, so it must not rely on anything read before)."""
        ...

    def many(self, sql: str, params: list[tuple[Any, ...]]) -> None: ...

    def count_later(self, sql: str, params: tuple[Any, ...] = ()) -> Callable[[], int]:
        """Send a write now, take its row count when the returned function is called: writes
        whose counts are taken together go to the server together (one round trip on
        PostgreSQL). The server still runs every statement in the order sent."""
        ...

    def later(self, sql: str, params: tuple[Any, ...] = ()) -> Callable[[], list[Row]]:
        """Send a read now, take its rows when the returned function is called: reads that do
        not depend on each other go to the server together (one round trip on PostgreSQL). The
        server still runs every statement in the order sent."""
        ...


def chunks(values: Sequence[str], size: int) -> list[tuple[str, ...]]:
    """``values`` in runs of at most ``size``: the parameters of one statement each (a
    statement's parameters are bounded: SQLite's at 32,766)."""
    return [tuple(values[o : o + size]) for o in range(0, len(values), size)]
