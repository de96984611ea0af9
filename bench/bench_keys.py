"""Concurrency keys and priorities: what they cost a claim and the daemon's throughput.

    .venv/bin/python bench/bench_keys.py                        # SQLite; ~1 min
    .venv/bin/python bench/bench_keys.py --store postgres
    .venv/bin/python bench/bench_keys.py --baseline-src /tmp/base/conduit_core/src

``daemon``: ``--work`` Work (10,000) stored in batches of 1,000 through ``POST /v1/work/batch``
into a running ``conduit daemon`` (its host loop, ``--workers`` slots, the test plugin's
in-process ``echo`` job), timed from the first submit until the store shows every one completed:
Work of a binding without a key, then of a binding with ``concurrency_key = "{customer}"`` and
``key_limit = 1`` over ``--keys`` (1,000) keys, then without a key at random priorities
(-10..10). Each on a fresh store, alternated ``--rounds`` times; the median of each, and its
ratio to no key (``--cases`` picks which besides no key).

``--baseline-src DIR`` also runs the no-key case with the daemon imported from ``DIR`` (the
``conduit_core/src`` of another commit, e.g. ``git archive main conduit_core/src | tar -x``):
the ratio of this branch's no-key throughput to that commit's (the target is at least 0.95).

``claims``: the store alone, in this process: ``--work`` ready Work, claimed 64 at a time until
none is left (``claim_ready``), all at priority 0 and then at random priorities; microseconds per
claimed attempt, and the ratio. Without capacity limits: the attempts are never settled, so the
slot count every limited claim takes would grow with each one and drown the read measured.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec

from conduit_core.http import ApiClient, BatchSubmitRequest, BatchSubmitResult, SubmitRequest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench_daemon (a fresh PostgreSQL database, wait_until)

from bench_daemon import wait_until  # noqa: E402

CONFIG = """\
[settings]
store = "{store}"
data_dir = "{data}"
concurrency = {workers}
job_concurrency = {workers}
http.listen = "127.0.0.1:{port}"

[bindings.plain]
executor = "echo"

[bindings.keyed]
executor = "echo"
concurrency_key = "{{customer}}"
key_limit = 1
"""
#: The baseline commit may not know concurrency keys: its config has the plain binding only.
BASELINE_CONFIG = CONFIG.split("[bindings.keyed]")[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Store:
    """A fresh store: a SQLite file or a PostgreSQL database; counts completed Work."""

    def __init__(self, kind: str, root: Path) -> None:
        self.db: Any = None
        if kind == "postgres":
            from bench_daemon import FreshDatabase

            self.db = FreshDatabase("conduit_keys")
            self.url = self.db.url
        else:
            self.url = str(root / "conduit.db")

    def completed(self) -> int:
        sql = "SELECT COUNT(*) FROM conduit_work WHERE status = 'completed'"
        if self.db is not None:
            return int(self.db.scalar(sql))
        with sqlite3.connect(self.url, timeout=30) as conn:
            return int(conn.execute(sql).fetchone()[0])

    def drop(self) -> None:
        if self.db is not None:
            self.db.drop()


def daemon_run(args: argparse.Namespace, case: str, src: str | None = None) -> float:
    """Jobs per second through a daemon: ``case`` is ``plain``, ``keyed`` or ``priority``."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = _Store(args.store, root)
        port = _free_port()
        config = (BASELINE_CONFIG if src else CONFIG).format(
            store=store.url, data=root / "data", workers=args.workers, port=port
        )
        (root / "conduit.toml").write_text(config)
        env = {**os.environ, "CONDUIT_TEST_PLUGIN_GATES": "selected"}
        if src:
            env["PYTHONPATH"] = src
        with (root / "daemon.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "conduit_core.cli", "daemon", "--config",
                 str(root / "conduit.toml")],
                stdout=log, stderr=subprocess.STDOUT, cwd=root, env=env,
            )  # fmt: skip
        try:
            token = root / "data" / "token"
            wait_until("the daemon's token", token.exists, 30)
            client = ApiClient(token.read_text().strip(), listen=f"127.0.0.1:{port}", timeout=30)
            wait_until("the daemon to answer", lambda: _answers(client), 30)
            rng = random.Random(7)
            items = [
                SubmitRequest(
                    binding="keyed" if case == "keyed" else "plain",
                    input={"customer": f"c{i % args.keys}"},
                    priority=rng.randint(-10, 10) if case == "priority" else None,
                )
                for i in range(args.work)
            ]
            started = time.perf_counter()
            for at in range(0, len(items), 1000):
                chunk = BatchSubmitRequest(items=items[at : at + 1000])
                client.request("POST", "/v1/work/batch", chunk, BatchSubmitResult)
            wait_until("every Work to complete", lambda: store.completed() >= args.work, 300)
            return args.work / (time.perf_counter() - started)
        finally:
            proc.kill()
            proc.wait(10)
            store.drop()


def _answers(client: ApiClient) -> bool:
    try:
        client.request("GET", "/v1/health", None, msgspec.Raw)
    except Exception:  # not up yet
        return False
    return True


async def _claims(url: str, n: int, priorities: bool) -> float:
    from conduit_core.model import Event, Work
    from conduit_core.storage import Claim, open_store
    from conduit_core.storage.conformance import snapshot

    rng = random.Random(7)
    async with await open_store(url) as store:
        items = []
        for i in range(n):
            work = Work(id=f"w{i:06d}", scope="root", binding="b", created_at_ms=1_000 + i,
                        updated_at_ms=1_000 + i,
                        priority=rng.randint(-10, 10) if priorities else 0)  # fmt: skip
            first = Event(id=f"e{i}", delivery_id=f"e{i}", type="t", pending=True,
                          accepted_at_ms=1_000)  # fmt: skip
            items.append((work, first))
        for at in range(0, n, 1000):
            await store.create_works(items[at : at + 1000])
        claimed = 0
        started = time.perf_counter()
        while claimed < n:
            got = await store.claim_ready(
                limit=64, snapshot_for=lambda w: snapshot(), owner="o", now_ms=10**9,
                lease_ms=60_000, capacity=None,
            )  # fmt: skip
            claimed += sum(isinstance(c, Claim) for c in got)
        return (time.perf_counter() - started) / n * 1e6


def claims_run(args: argparse.Namespace, priorities: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        store = _Store(args.store, Path(tmp))
        url = store.url if args.store == "postgres" else f"sqlite://{store.url}"
        try:
            return anyio.run(_claims, url, args.work, priorities)
        finally:
            store.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--work", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-src", default=None)
    parser.add_argument("--only", choices=["daemon", "claims"], default=None)
    parser.add_argument("--cases", nargs="*", choices=["keyed", "priority"],
                        default=["keyed", "priority"], help="besides plain (and baseline)")
    args = parser.parse_args()
    if args.only != "claims":
        cases = ["plain", *args.cases] + (["baseline"] if args.baseline_src else [])
        rates: dict[str, list[float]] = {case: [] for case in cases}
        for _ in range(args.rounds):
            for case in cases:
                src = args.baseline_src if case == "baseline" else None
                rates[case].append(daemon_run(args, "plain" if src else case, src))
        median = {case: statistics.median(r) for case, r in rates.items()}
        for case in cases:
            print(f"daemon {args.store:8} {case:9} {median[case]:7.0f} jobs/s "
                  f"(runs {[round(r) for r in rates[case]]}) "
                  f"ratio to plain {median[case] / median['plain']:.2f}", flush=True)  # fmt: skip
        if args.baseline_src:
            print(f"daemon {args.store:8} no key/priority, this branch / baseline: "
                  f"{median['plain'] / median['baseline']:.2f}")  # fmt: skip
    if args.only != "daemon":
        flat = [claims_run(args, False) for _ in range(args.rounds)]
        ranked = [claims_run(args, True) for _ in range(args.rounds)]
        a, b = statistics.median(flat), statistics.median(ranked)
        print(f"claims {args.store:8} priority 0: {a:.0f} us/attempt, random priorities: "
              f"{b:.0f} us/attempt, ratio {b / a:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
