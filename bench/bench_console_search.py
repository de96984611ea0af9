"""Work search with many Work in the store (``bench_console.py --fill N``): page 1, a deep page
via the cursor, an id prefix, a status, a binding and an input key, through the HTTP API of a
real ``conduit daemon``.

The store is filled by bulk SQL (``executemany`` on SQLite, ``COPY`` on PostgreSQL) with the
rows conduit itself writes (``work_params``): 90 % completed, 5 % exhausted (ready, retries
spent), 3 % failed, 2 % cancelled; 10 bindings, 5 scopes; the first input ``{"customer":
"c<i % 1000>"}``; creation times 10 ms apart.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import anyio
import httpx

from conduit_core.http._search import encode_cursor
from conduit_core.model import Event, Work, WorkStatus
from conduit_core.storage import open_store
from conduit_core.storage._sql import WORK_COLUMNS, work_params

T0 = 1_780_000_000_000
PG_URL = os.environ.get(
    "CONDUIT_BENCH_PG_URL",
    os.environ.get("CONDUIT_TEST_PG_URL", "postgresql://root@/postgres?host=/var/run/postgresql"),
)
CONFIG = """\
[settings]
store = "{store}"
data_dir = "{data}"
http.listen = "127.0.0.1:{port}"
{bindings}
"""


def _row(i: int) -> tuple[Any, ...]:
    bucket = i % 100
    blocked = None
    if bucket < 90:
        status = WorkStatus.COMPLETED
    elif bucket < 95:
        status, blocked = WorkStatus.READY, "retry_exhausted"
    elif bucket < 98:
        status = WorkStatus.FAILED
    else:
        status = WorkStatus.CANCELLED
    created = T0 + i * 10
    work = Work(
        id=f"w-{i:08d}", scope=f"s{i % 5}", binding=f"b{i % 10}", status=status,
        created_at_ms=created, updated_at_ms=created + 5, last_attempt=1,
        failure_count=int(blocked is not None), blocked_reason=blocked,
    )  # fmt: skip
    first = Event(id=f"ev-{i}", delivery_id=f"ev-{i}", type="core.input",
                  payload={"customer": f"c{i % 1000}"}, accepted_at_ms=created)  # fmt: skip
    return work_params(work, first)


def _rows(n: int) -> Iterator[tuple[Any, ...]]:
    return (_row(i) for i in range(n))


def _fill_sqlite(path: Path, n: int) -> None:
    import sqlite3

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    marks = ", ".join("?" for _ in WORK_COLUMNS.split(","))
    sql = f"INSERT INTO conduit_work ({WORK_COLUMNS}) VALUES ({marks})"
    chunk: list[tuple[Any, ...]] = []
    for row in _rows(n):
        chunk.append(row)
        if len(chunk) == 50_000:
            conn.executemany(sql, chunk)
            chunk.clear()
    conn.executemany(sql, chunk)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()


def _fill_postgres(url: str, n: int) -> None:
    import psycopg

    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY conduit_work ({WORK_COLUMNS}) FROM STDIN") as copy:
            for row in _rows(n):
                copy.write_row(row)
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE conduit_work")


def _scratch_db(name: str) -> str:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    parts = urlsplit(PG_URL)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _drop_db(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_search_bench(n: int, kind: str, requests: int) -> None:
    db_name = f"conduit_bench_search_{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="conduit-bench-search-") as tmp:
        root = Path(tmp)
        url = str(root / "conduit.db") if kind == "sqlite" else _scratch_db(db_name)
        try:
            began = time.monotonic()

            async def create() -> None:
                store = await open_store(url)  # the schema, every migration applied
                await store.aclose()

            anyio.run(create)
            if kind == "sqlite":
                _fill_sqlite(Path(url), n)
            else:
                _fill_postgres(url, n)
            print(f"{kind}: filled {n:,} Work in {time.monotonic() - began:.1f} s")
            _serve_and_time(root, url, n, requests)
        finally:
            if kind == "postgres":
                _drop_db(db_name)


def _serve_and_time(root: Path, url: str, n: int, requests: int) -> None:
    port = _port()
    bindings = "\n".join(f'[bindings.b{b}]\nexecutor = "shell"\nconfig = {{ command = "true" }}\n'
                         for b in range(10))  # fmt: skip
    (root / "conduit.toml").write_text(
        CONFIG.format(store=url, data=root / "data", port=port, bindings=bindings)
    )
    with (root / "daemon.log").open("wb") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "conduit_core.cli", "daemon", "--config",
             str(root / "conduit.toml")], stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        api = _client(root, port)
        deep = n - n // 10  # 90 % of the way down the newest-first list
        cursor = encode_cursor((T0 + (n - 1 - deep) * 10, f"w-{n - 1 - deep:08d}"))
        cases = {
            "page 1 (newest first, 50)": {"limit": 50},
            f"deep page via cursor (row {deep:,})": {"limit": 50, "after": cursor},
            "oldest first, page 1": {"limit": 50, "order": "oldest"},
            "id exact": {"id": f"w-{n // 2:08d}"},
            "id prefix (100 match)": {"id_prefix": f"w-{n // 200:06d}", "limit": 50},
            "status=exhausted": {"status": "exhausted", "limit": 50},
            "status=failed, deep via cursor": {"status": "failed", "limit": 50, "after": cursor},
            "binding=b3 & scope=s3": {"binding": "b3", "scope": "s3", "limit": 50},
            "since=-1h (none match)": {"since": "-1h", "limit": 50},
            "input.customer=c42 (1 in 1000)": {"input.customer": "c42", "limit": 50},
            "input.customer=c42 & binding=b2": {"input.customer": "c42", "binding": "b2",
                                                "limit": 50},
        }  # fmt: skip
        print(f"{'GET /v1/work …':42} {'median':>9} {'max':>9}  rows")
        for name, params in cases.items():
            times = []
            for _ in range(requests):
                t = time.monotonic()
                answer = api.get(f"/v1/work?{urlencode(params)}")
                times.append((time.monotonic() - t) * 1000)
                answer.raise_for_status()
            rows = len(answer.json()["items"])
            print(f"{name:42} {statistics.median(times):7.1f}ms {max(times):7.1f}ms  {rows}")
    finally:
        daemon.terminate()
        daemon.wait(30)


def _client(root: Path, port: int) -> httpx.Client:
    deadline = time.monotonic() + 120
    while True:
        try:
            token = (root / "data" / "token").read_text().strip()
            api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                               headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            api.get("/v1/health").raise_for_status()
            return api
        except (OSError, httpx.HTTPError):
            if time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not start; see {root / 'daemon.log'}") from None
            time.sleep(0.2)
