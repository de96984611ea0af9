"""Two daemons on one PostgreSQL store: every Work runs exactly once, never two live attempts."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

import psycopg
import pytest

from conduit_core.http import WorkPage
from tests.daemon.conftest import Daemon, wait_for

WORK_ITEMS = int(os.environ.get("CONDUIT_STRESS_WORK", "200"))


@pytest.fixture
def store(postgres_url: str) -> str:
    return postgres_url


@pytest.mark.slow
@pytest.mark.postgres
def test_two_daemons_run_each_work_once(make_daemon: Callable[..., Daemon], store: str) -> None:
    first, second = make_daemon().start(rescan=0.5), make_daemon().start(rescan=0.5)
    ids = [(first, second)[i % 2].submit("ok", id=f"w{i:04d}") for i in range(WORK_ITEMS)]

    doubled: list[tuple[str, int]] = []
    with psycopg.connect(store, autocommit=True) as conn:

        def all_done() -> bool:
            doubled.extend(
                conn.execute(
                    "SELECT work_id, COUNT(*) FROM conduit_execution WHERE live = 1 "
                    "GROUP BY work_id HAVING COUNT(*) > 1"
                ).fetchall()
            )
            (left,) = conn.execute(
                "SELECT COUNT(*) FROM conduit_work WHERE status <> 'completed'"
            ).fetchone() or (0,)
            return left == 0

        wait_for(f"{WORK_ITEMS} Work to complete", all_done, timeout=120)
        attempts = Counter(
            dict(conn.execute("SELECT work_id, COUNT(*) FROM conduit_execution GROUP BY work_id"))
        )
    assert not doubled, f"Work with two live attempts: {doubled[:5]}"
    assert attempts == Counter(dict.fromkeys(ids, 1))
    runs = Counter(line.split()[0] for line in first.side.read_text().splitlines())
    assert runs == Counter(dict.fromkeys(ids, 1))
    # Both daemons took part (the wake channel and the claims were shared).
    assert "attempt start" in first.log()
    assert "attempt start" in second.log()
    page = first.api().request("GET", "/v1/work?limit=500&status=completed", None, WorkPage)
    assert len(page.items) == WORK_ITEMS
