"""PostgreSQL transactions are pipelined: what that must not change.

A write whose outcome nobody reads (``Cx.run``) is queued and reaches the server with the next
read or with the commit, so its error surfaces later than the statement that caused it. These
cases pin that a transaction is still all or nothing whichever statement fails and wherever the
error surfaces, that the pooled connection is clean afterwards, and that ``count_or_restart``
commits a lone operation with its statement or, when the statement changed nothing, lets the
operation go on in a fresh transaction that is itself all or nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conduit_core.storage._postgres import PostgresStore
from conduit_core.storage._sql import Cx


def _with_table(postgres_url: str, **options: Any) -> Iterator[PostgresStore]:
    store = PostgresStore.open(postgres_url, masked_url="postgresql://test", **options)
    store.transaction(
        lambda cx: cx.run("CREATE TABLE t_pipe (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
    )
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresStore]:
    yield from _with_table(postgres_url)


def _ids(store: PostgresStore) -> list[int]:
    return [
        r[0] for r in store.transaction(lambda cx: cx.rows("SELECT id FROM t_pipe ORDER BY id"))
    ]


def test_a_queued_write_that_fails_at_the_next_read_rolls_back_everything(
    pg: PostgresStore,
) -> None:
    def body(cx: Cx) -> None:
        cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (1, 1))
        cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (2, None))  # NOT NULL: fails
        cx.rows("SELECT 1")  # the queued error surfaces here

    with pytest.raises(psycopg.errors.NotNullViolation):
        pg.transaction(body)
    assert _ids(pg) == []
    # Every pooled connection is usable afterwards (none left in a failed transaction).
    for _ in range(10):
        pg.transaction(lambda cx: cx.rows("SELECT 1"))


def test_a_queued_write_that_fails_at_commit_rolls_back_everything(pg: PostgresStore) -> None:
    def body(cx: Cx) -> None:
        cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (1, 1))
        cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (2, None))  # surfaces at COMMIT

    with pytest.raises(psycopg.errors.NotNullViolation):
        pg.transaction(body)
    assert _ids(pg) == []


def test_an_operation_error_after_queued_writes_rolls_them_back(pg: PostgresStore) -> None:
    class Refused(Exception):
        pass

    def body(cx: Cx) -> None:
        cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (1, 1))
        raise Refused

    with pytest.raises(Refused):
        pg.transaction(body)
    assert _ids(pg) == []


def test_reads_see_the_queued_writes_before_them(pg: PostgresStore) -> None:
    def body(cx: Cx) -> list[Any]:
        cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (1, 1))
        cx.run("UPDATE t_pipe SET v = v + 1 WHERE id = ?", (1,))
        return cx.rows("SELECT v FROM t_pipe WHERE id = ?", (1,))

    assert pg.transaction(body) == [(2,)]


def test_count_or_restart_commits_a_lone_operation_with_its_statement(pg: PostgresStore) -> None:
    pg.transaction(lambda cx: cx.run("INSERT INTO t_pipe (id, v) VALUES (1, 0)"))

    def body(cx: Cx) -> int:
        changed = cx.count_or_restart("UPDATE t_pipe SET v = 5 WHERE id = ?", (1,))
        with pytest.raises(RuntimeError, match="after the operation committed"):
            cx.run("UPDATE t_pipe SET v = 6 WHERE id = ?", (1,))
        return changed

    assert pg.transaction(body, alone=True) == 1
    assert pg.transaction(lambda cx: cx.rows("SELECT v FROM t_pipe")) == [(5,)]


def test_count_or_restart_goes_on_in_a_fresh_transaction_that_is_all_or_nothing(
    pg: PostgresStore,
) -> None:
    class Refused(Exception):
        pass

    def body(cx: Cx) -> None:
        assert cx.count_or_restart("UPDATE t_pipe SET v = 5 WHERE id = ?", (99,)) == 0
        cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (2, 2))
        raise Refused  # the fallback refuses: its write must not stay

    with pytest.raises(Refused):
        pg.transaction(body, alone=True)
    assert _ids(pg) == []

    def fallback(cx: Cx) -> int:
        assert cx.count_or_restart("UPDATE t_pipe SET v = 5 WHERE id = ?", (99,)) == 0
        cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (3, 3))
        return len(cx.rows("SELECT id FROM t_pipe"))

    assert pg.transaction(fallback, alone=True) == 1
    assert _ids(pg) == [3]


def test_count_or_restart_in_a_batch_never_commits_early(pg: PostgresStore) -> None:
    """Not alone (a group-commit batch): the statement is only counted, so a later failure
    still rolls back every operation of the batch."""
    pg.transaction(lambda cx: cx.run("INSERT INTO t_pipe (id, v) VALUES (1, 0)"))

    def batch(cx: Cx) -> None:
        assert cx.count_or_restart("UPDATE t_pipe SET v = 5 WHERE id = ?", (1,)) == 1
        cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (2, None))  # fails at commit

    with pytest.raises(psycopg.errors.NotNullViolation):
        pg.transaction(batch)
    assert pg.transaction(lambda cx: cx.rows("SELECT id, v FROM t_pipe")) == [(1, 0)]


def test_a_lone_update_that_fails_leaves_nothing_and_a_clean_connection(
    pg: PostgresStore,
) -> None:
    pg.transaction(lambda cx: cx.run("INSERT INTO t_pipe (id, v) VALUES (1, 0)"))

    def body(cx: Cx) -> int:
        return cx.count_or_restart("UPDATE t_pipe SET v = ? WHERE id = ?", (None, 1))

    for _ in range(3):  # more times than the pool has idle connections at first
        with pytest.raises(psycopg.errors.NotNullViolation):
            pg.transaction(body, alone=True)
    assert pg.transaction(lambda cx: cx.rows("SELECT v FROM t_pipe")) == [(0,)]
    assert pg.transaction(lambda cx: cx.count_or_restart("UPDATE t_pipe SET v = 1"), alone=True)
    assert pg.transaction(lambda cx: cx.rows("SELECT v FROM t_pipe")) == [(1,)]


# --- conduit's own pipeline (``storage/_pipeline.py``): prepared statements and results ------


def _conduit_statements(store: PostgresStore) -> list[str]:
    """The statements prepared under conduit's names on the connection the read runs on."""
    rows = store.transaction(
        lambda cx: cx.rows(
            "SELECT name FROM pg_prepared_statements WHERE name LIKE '\\_conduit\\_%'"
        )
    )
    return [r[0] for r in rows]


@pytest.fixture
def pg1(postgres_url: str) -> Iterator[PostgresStore]:
    """One pooled connection: every transaction runs on it."""
    yield from _with_table(postgres_url, pool_size=1)


def test_each_statement_is_prepared_once_per_connection(pg1: PostgresStore) -> None:
    for i in range(30):
        pg1.transaction(
            lambda cx, i=i: (
                cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (i, i))
                or cx.rows("SELECT v FROM t_pipe WHERE id = ?", (i,))
            )
        )
    # The fixture's CREATE TABLE, BEGIN, the writers' lock, the INSERT, the SELECT, COMMIT and
    # this read: whatever the number of transactions (prepared anew each time: over 150).
    assert len(_conduit_statements(pg1)) <= 7


def test_results_come_back_typed(pg1: PostgresStore) -> None:
    pg1.transaction(lambda cx: cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (7, 42)))
    rows = pg1.transaction(
        lambda cx: cx.rows(
            "SELECT id, v * 2, 'x' || v, NULL, v > 40 FROM t_pipe WHERE id = ?", (7,)
        )
    )
    assert rows == [(7, 84, "x42", None, True)]
    counted = pg1.transaction(
        lambda cx: cx.count("UPDATE t_pipe SET v = v + 1 WHERE id >= ?", (0,))
    )
    assert counted == 1


def test_statements_dropped_by_the_server_are_prepared_again(pg1: PostgresStore) -> None:
    pg1.transaction(lambda cx: cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (1, 1)))
    assert _conduit_statements(pg1)
    with pg1._pool.connection() as conn:  # the only connection: behind the store's back
        conn.execute("DEALLOCATE ALL")
    # The next transaction finds its statements gone, and is retried with them prepared again.
    pg1.transaction(lambda cx: cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (2, 2)))
    assert _ids(pg1) == [1, 2]


def test_a_rollback_that_drops_every_statement_leaves_the_next_transaction_working(
    pg1: PostgresStore,
) -> None:
    # psycopg prepares a statement of its own from its fifth run (a one-statement read goes
    # through psycopg's cursor); its rollback then ends with DEALLOCATE ALL.
    for _ in range(6):
        pg1.read_statement(lambda cx: cx.rows("SELECT count(*) FROM t_pipe"))
    pg1.transaction(lambda cx: cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (1, 1)))

    def refused(cx: Cx) -> None:
        cx.rows("SELECT id FROM t_pipe")
        raise ValueError("refused after a read")

    with pytest.raises(ValueError, match="refused after a read"):
        pg1.transaction(refused)
    pg1.transaction(lambda cx: cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (2, 2)))
    assert _ids(pg1) == [1, 2]


def test_a_round_trip_takes_every_result_in_one_wait(
    pg1: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conduit_core.storage._pipeline import Pipeline

    waits = [0]
    wait = psycopg.Connection.wait

    def counting_wait(self: psycopg.Connection[Any], *args: Any, **kwargs: Any) -> Any:
        waits[0] += 1
        return wait(self, *args, **kwargs)

    per_sync: list[int] = []
    sync = Pipeline.sync

    def counting_sync(self: Pipeline) -> None:
        before = waits[0]
        sync(self)
        per_sync.append(waits[0] - before)

    monkeypatch.setattr(psycopg.Connection, "wait", counting_wait)
    monkeypatch.setattr(Pipeline, "sync", counting_sync)

    def body(cx: Cx) -> list[tuple[Any, ...]]:
        for i in range(20):
            cx.run("INSERT INTO t_pipe (id, v) VALUES (?, ?)", (i, i))
        return cx.rows("SELECT count(*) FROM t_pipe")

    assert pg1.transaction(body) == [(20,)]
    # One wait per round trip, however many statements it carries (psycopg's generators
    # waited once per statement's results: 27 for the read's round trip here).
    assert per_sync
    assert per_sync == [1] * len(per_sync)


def test_large_statements_and_results_both_ways_in_one_round_trip(pg1: PostgresStore) -> None:
    # Results of several MB come back while parameters of several MB are still being sent:
    # whoever sends must also read (libpq does while it cannot send; the exchange reads when
    # the socket is readable), or both sides wait on full socket buffers forever.
    pg1.transaction(lambda cx: cx.run("CREATE TABLE t_big (id INTEGER PRIMARY KEY, s TEXT)"))
    mb = 1 << 20

    def body(cx: Cx) -> list[list[tuple[Any, ...]]]:
        repeats = [cx.later("SELECT repeat('y', ?)", (2 * mb,)) for _ in range(4)]
        for i in range(4):
            cx.run("INSERT INTO t_big (id, s) VALUES (?, ?)", (i, "x" * (2 * mb)))
        return [take() for take in repeats]

    results = pg1.transaction(body)
    assert [len(rows[0][0]) for rows in results] == [2 * mb] * 4
    sizes = pg1.transaction(lambda cx: cx.rows("SELECT sum(length(s)) FROM t_big"))
    assert sizes == [(8 * mb,)]
