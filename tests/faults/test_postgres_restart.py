"""PostgreSQL restarted under load: two real daemons keep running, reconnect with backoff, log
the outage once, and every Work accepted runs exactly once.

The server is a private one (see ``_pgserver.py``), crash-stopped with ``pg_ctl stop -m
immediate`` while shell jobs run and finish, so the results of jobs that ended during the outage
must be recorded after it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import psycopg
import pytest

from tests.daemon.conftest import Daemon, wait_for
from tests.faults._pgserver import PrivateServer

pytestmark = pytest.mark.postgres

OUTAGE_LINE = re.compile(r"store unavailable")
BACK_LINE = re.compile(r"store available again")
OUTAGE_S = 3.0


def _completed(daemon: Daemon, work_id: str) -> bool:
    try:
        return str(daemon.show(work_id).work.status) == "completed"
    except Exception:  # 503 while the store is still coming back
        return False


def test_postgres_restart_under_load(
    tmp_path: Path, private_pg: PrivateServer, private_pg_url: str, daemons: list[Daemon]
) -> None:
    d1 = Daemon(tmp_path, private_pg_url, name="d1", lease=10, sleep=1.0)
    d2 = Daemon(tmp_path, private_pg_url, name="d2", lease=10, sleep=1.0)
    daemons += [d1, d2]
    d1.start()
    d2.start()

    before = [d1.submit("ok") for _ in range(10)] + [d2.submit("ok") for _ in range(10)]
    sleepers = [d1.submit("sleeper") for _ in range(3)] + [d2.submit("sleeper") for _ in range(3)]
    wait_for("every sleeper to start", lambda: all(d1.runs(w, "start") for w in sleepers))

    private_pg.stop()
    # The sleepers end while the store is down: their results are written after it returns.
    wait_for("every sleeper to end", lambda: all(d1.runs(w, "end") for w in sleepers))
    for daemon in (d1, d2):
        wait_for(f"{daemon.name} to log the outage", lambda d=daemon: OUTAGE_LINE.search(d.log()))
    # Nothing is accepted while the store is down: a submit is refused, nothing stored.
    status, body = d1.raw("POST", "/v1/work", b'{"binding": "ok"}')
    assert status == 503, body
    assert body["code"] in ("store_unavailable", "store_unreachable"), body
    lines_during = {d.name: len(d.log().splitlines()) for d in (d1, d2)}
    # The outage lasts OUTAGE_S: meanwhile both daemons stay up and answer, with a coded 503
    # for anything that needs the store, while their passes fail against the dead server.
    outage_end = time.monotonic() + OUTAGE_S
    while time.monotonic() < outage_end:
        for daemon in (d1, d2):
            assert daemon.proc is not None
            assert daemon.proc.poll() is None, daemon.log()
            status, body = daemon.raw("GET", f"/v1/work/{before[0]}")
            assert status == 503, body
        time.sleep(0.2)  # the probe's pace, not a wait for a state
    private_pg.start()

    after = [_submit_retrying(d1, "ok") for _ in range(5)] + [
        _submit_retrying(d2, "ok") for _ in range(5)
    ]
    everything = before + sleepers + after
    for work_id in everything:
        wait_for(f"{work_id} to complete", lambda w=work_id: _completed(d1, w), timeout=60)

    for daemon in (d1, d2):
        assert daemon.proc is not None
        assert daemon.proc.poll() is None, daemon.log()
        log = daemon.log()
        assert len(OUTAGE_LINE.findall(log)) == 1, log
        assert len(BACK_LINE.findall(log)) == 1, log
        assert "Traceback" not in log, log
        # The outage and its end are the only warnings: no line per failed step, renewal,
        # reconnection or 503 answered meanwhile.
        warnings = [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line]
        assert len(warnings) == 2, warnings
        # No flood: a handful of lines for a multi-second outage, not one per pass or per lease.
        grown = len(log.splitlines()) - lines_during[daemon.name]
        assert grown < 60, log
    for work_id in before + after:
        assert d1.runs(work_id) == 1, (work_id, d1.side.read_text())
    for work_id in sleepers:
        assert (d1.runs(work_id, "start"), d1.runs(work_id, "end")) == (1, 1), work_id
    # Nothing duplicated in the store either: one attempt each, and the refused submit is absent.
    for work_id in everything:
        detail = d1.show(work_id)
        assert len(detail.attempts) == 1, (work_id, detail.attempts)
    assert _count_work(private_pg_url) == len(everything)


def _submit_retrying(daemon: Daemon, binding: str) -> str:
    """Submit once the daemon's store answers again (a 503 before that stores nothing)."""

    def attempt() -> str | None:
        status, body = daemon.raw("POST", "/v1/work", f'{{"binding": "{binding}"}}'.encode())
        if status == 503:
            return None
        assert status in (200, 201), body
        work_id: str = body["work"]["id"]
        return work_id

    return wait_for(f"{daemon.name} to accept a submit", attempt, timeout=30)


def _count_work(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM conduit_work").fetchone()
    assert row is not None
    return int(row[0])
