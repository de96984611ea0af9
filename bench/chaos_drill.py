"""Chaos drill: a real daemon SIGKILLed at random moments while shell Work runs, then checked.

    .venv/bin/python bench/chaos_drill.py --store sqlite --items 150 --seconds 45
    .venv/bin/python bench/chaos_drill.py --store postgres --items 10000 --kills 1000

N shell items are submitted straight into a fresh store. Each item's job appends
``<item> <pid> <start>`` to ``starts.log`` as it begins and ``<item> <pid> <start> <end>`` to
``side-effects.log`` as it ends. A daemon runs them and is SIGKILLed 0.2-2.5 s (uniform) after
it starts serving, and restarted at once, for ``--seconds`` (or until ``--kills`` kills); then
one last daemon runs until every item has settled and is stopped with SIGTERM. The checker then
asserts, per item: completed, in exactly one attempt, with no failed attempt and no failure
counted (a kill may cost a ``relaunched`` segment, nothing else), started exactly once, its side
effect exactly once, never two runs of it at once; and no process carrying a launch marker of
the drill is left. It prints one JSON line (kills, attempts, duplicates, burnt_retries, orphans,
...) and exits 1 on any violation. ``--self-test`` feeds the checker a log with a duplicate to
show it can fail.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import psutil

from conduit_core.model import Event, Execution, ExecutionStatus, Work, WorkStatus
from conduit_core.storage import Store, open_store

PG_URL = os.environ.get(
    "CONDUIT_TEST_PG_URL", "postgresql://root@/postgres?host=/var/run/postgresql"
)
CONFIG = """\
[settings]
store = "{store}"
data_dir = "{data}"
concurrency = {concurrency}
job_concurrency = {concurrency}
lease_seconds = {lease}
retry_delays_seconds = [0.5, 0.5, 0.5]
http.listen = "127.0.0.1:{port}"

[bindings.drill]
executor = "shell"
config = {{ command = '{command}', stop_grace_seconds = 2 }}
"""
# Seconds since the epoch with nanoseconds (GNU date); the job's own pid is $$.
JOB = (
    's=$(date +%s.%N); echo "$CONDUIT_WORK_ID $$ $s" >> {root}/starts.log; sleep {job}; '
    'echo "$CONDUIT_WORK_ID $$ $s $(date +%s.%N)" >> {root}/side-effects.log'
)


@dataclass(frozen=True)
class AttemptFacts:
    attempt: int
    completed: bool
    failure_code: str | None
    relaunched_segments: int
    recovered_segments: int

    @classmethod
    def of(cls, execution: Execution) -> AttemptFacts:
        return cls(
            attempt=execution.attempt,
            completed=execution.status is ExecutionStatus.COMPLETED,
            failure_code=execution.failure_code,
            relaunched_segments=sum(s.relaunched for s in execution.segments),
            recovered_segments=sum(s.recovered for s in execution.segments),
        )


@dataclass
class ItemRecord:
    """What the store says about one item after the drill."""

    attempts: list[AttemptFacts]
    failure_count: int
    retry_pending: bool


@dataclass
class Verdict:
    summary: dict[str, Any]
    violations: list[str] = field(default_factory=list)


def check(
    items: list[str],
    records: dict[str, ItemRecord],
    starts: list[str],
    side_effects: list[str],
    orphans: list[str],
) -> Verdict:
    """The drill's invariants over what the store and the logs say; pure, so it can be tested."""
    violations: list[str] = []
    start_count = Counter(line.split()[0] for line in starts if line.strip())
    intervals: dict[str, list[tuple[float, float]]] = {}
    for line in side_effects:
        parts = line.split()
        if len(parts) == 4:
            intervals.setdefault(parts[0], []).append((float(parts[2]), float(parts[3])))
    duplicates = sum(max(0, n - 1) for n in start_count.values())
    duplicates += sum(max(0, len(v) - 1) for v in intervals.values())
    overlaps = 0
    burnt = 0
    failed_attempts = 0
    relaunched = 0
    recovered = 0
    attempts = 0
    for item in items:
        record = records.get(item)
        if record is None:
            violations.append(f"{item}: missing from the store")
            continue
        attempts += len(record.attempts)
        relaunched += sum(a.relaunched_segments for a in record.attempts)
        recovered += sum(a.recovered_segments for a in record.attempts)
        failed = [a for a in record.attempts if not a.completed]
        failed_attempts += len(failed)
        # Each failed attempt spent a retry (failure_count resets once the Work completes).
        burnt += len(failed) + (1 if record.retry_pending else 0)
        if len(record.attempts) != 1 or failed:
            codes = [(a.attempt, a.completed, a.failure_code) for a in record.attempts]
            violations.append(f"{item}: attempts {codes}, expected one completed attempt")
        if record.failure_count or record.retry_pending:
            violations.append(
                f"{item}: failure_count {record.failure_count}, retry armed {record.retry_pending}"
            )
        if start_count[item] != 1:
            violations.append(f"{item}: started {start_count[item]} times")
        runs = sorted(intervals.get(item, []))
        if len(runs) != 1:
            violations.append(f"{item}: side effect {len(runs)} times")
        for (_, end), (start, _) in itertools.pairwise(runs):
            if start < end:
                overlaps += 1
                violations.append(f"{item}: two runs at once")
    violations.extend(f"orphan process: {o}" for o in orphans)
    summary = {
        "items": len(items),
        "attempts": attempts,
        "failed_attempts": failed_attempts,
        "relaunched_segments": relaunched,
        "recovered_segments": recovered,
        "duplicates": duplicates,
        "overlaps": overlaps,
        "burnt_retries": burnt,
        "orphans": len(orphans),
    }
    return Verdict(summary=summary, violations=violations)


async def submit_items(store: Store, items: list[str], binding: str) -> None:
    """One Work per item, each with its first input, straight into the store."""
    now = int(time.time() * 1000)
    for item in items:
        work = Work(id=item, scope="root", binding=binding, created_at_ms=now,
                    updated_at_ms=now)  # fmt: skip
        first = Event(
            id=f"{item}/in1", delivery_id=f"{item}/in1", type="input", payload={},
            work_id=item, pending=True, accepted_at_ms=now,
        )  # fmt: skip
        await store.create_work(work, first_input=first)


def drill_processes(prefix: str) -> list[str]:
    """Live processes carrying a launch marker of this drill's items."""
    found = []
    for process in psutil.process_iter(["status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            environ = process.environ()
        except psutil.Error:
            continue
        if "CONDUIT_LAUNCH_MARKER" in environ and environ.get("CONDUIT_WORK_ID", "").startswith(
            prefix
        ):
            found.append(f"pid {process.pid} {environ['CONDUIT_LAUNCH_MARKER']}")
    return found


class Drill:
    def __init__(self, args: argparse.Namespace, root: Path, store: str) -> None:
        self.args = args
        self.root = root
        self.store = store
        self.prefix = f"drill-{uuid.uuid4().hex[:8]}-"
        self.items = [f"{self.prefix}{n:05}" for n in range(args.items)]
        self.config = root / "conduit.toml"
        self.port = _free_port()
        self.config.write_text(
            CONFIG.format(
                store=store, data=root / "data", concurrency=args.concurrency, lease=args.lease,
                port=self.port,
                command=JOB.format(root=root, job=args.job_seconds),
            )
        )  # fmt: skip
        self.log = (root / "daemon.log").open("ab")
        self.daemon: subprocess.Popen[bytes] | None = None
        self.kills = 0

    def start_daemon(self) -> None:
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "conduit_core.cli", "daemon", "--config", str(self.config),
             "--rescan", "0.2"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.root,
        )  # fmt: skip

    def wait_listening(self, seconds: float = 60.0) -> None:
        """Until the daemon's HTTP port accepts connections: it has opened its store by then."""
        import socket

        assert self.daemon is not None
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.daemon.poll() is None:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)

    def kill_daemon(self) -> None:
        assert self.daemon is not None
        if self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGKILL)
            self.kills += 1
        self.daemon.wait()

    async def submit(self) -> None:
        store = await open_store(self.store)
        try:
            await submit_items(store, self.items, "drill")
        finally:
            await store.aclose()

    async def records(self) -> dict[str, ItemRecord]:
        store = await open_store(self.store)
        try:
            found = {}
            for item in self.items:
                work = await store.get_work(item)
                executions = await store.list_executions(item)
                found[item] = ItemRecord(
                    attempts=[AttemptFacts.of(e) for e in executions],
                    failure_count=work.failure_count,
                    retry_pending=work.retry_timer_id is not None,
                )
            return found
        finally:
            await store.aclose()

    async def settled(self) -> bool:
        """Every item's Work completed (one cheap paged read, not one per item)."""
        store = await open_store(self.store)
        try:
            completed, after = 0, None
            while page := await store.list_work(
                status=WorkStatus.COMPLETED, limit=500, after=after
            ):
                completed += sum(w.id.startswith(self.prefix) for w in page)
                after = page[-1].id
            return completed >= len(self.items)
        finally:
            await store.aclose()

    def chaos(self) -> None:
        rng = random.Random(self.args.seed)
        deadline = time.monotonic() + self.args.seconds
        while time.monotonic() < deadline and (not self.args.kills or self.kills < self.args.kills):
            self.start_daemon()
            # The gap counts from the moment the daemon serves, so the kills land in its work
            # (recovery, claims, launches) rather than in the interpreter's start-up.
            self.wait_listening()
            time.sleep(rng.uniform(self.args.min_gap, self.args.max_gap))
            self.kill_daemon()

    async def finish(self) -> None:
        self.start_daemon()
        deadline = time.monotonic() + self.args.settle_seconds
        while not await self.settled():
            if time.monotonic() > deadline:
                break
            assert self.daemon is not None
            if self.daemon.poll() is not None:
                self.start_daemon()  # a last daemon that died on its own is restarted too
            await anyio.sleep(0.5)
        assert self.daemon is not None
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(60)
        except subprocess.TimeoutExpired:
            self.kill_daemon()

    def lines(self, name: str) -> list[str]:
        path = self.root / name
        return path.read_text().splitlines() if path.exists() else []


async def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="conduit-drill-") as tmp:
        root = Path(tmp)
        fresh = (
            contextlib.nullcontext(args.store_url)
            if args.store_url
            else scratch_store(args.store, root, "conduit_drill")
        )
        with fresh as store:
            drill = Drill(args, root, store)
            await drill.submit()
            started = time.monotonic()
            await anyio.to_thread.run_sync(drill.chaos)
            chaos_seconds = time.monotonic() - started
            started_in_chaos = len(drill.lines("starts.log"))
            await drill.finish()
            # Stop-confirmation of the last attempts may trail the daemon's exit by a moment.
            orphans = drill_processes(drill.prefix)
            verdict = check(
                drill.items, await drill.records(), drill.lines("starts.log"),
                drill.lines("side-effects.log"), orphans,
            )  # fmt: skip
            for orphan in orphans:
                _kill(orphan)
        summary = {
            "store": args.store, "kills": drill.kills, **verdict.summary,
            "chaos_seconds": round(chaos_seconds, 1), "started_during_kills": started_in_chaos,
            "total_seconds": round(time.monotonic() - started, 1),
            "violations": len(verdict.violations), "ok": not verdict.violations,
        }  # fmt: skip
        for violation in verdict.violations[:20]:
            print(violation, file=sys.stderr)
        print(json.dumps(summary), flush=True)
        return 0 if not verdict.violations else 1


def self_test() -> int:
    """The checker must catch a duplicate run (and pass the same data without it)."""
    items = ["i1"]
    good = ["i1 10 1.0 2.0"]
    one = AttemptFacts(
        attempt=1, completed=True, failure_code=None, relaunched_segments=1, recovered_segments=1
    )
    records = {"i1": ItemRecord(attempts=[one], failure_count=0, retry_pending=False)}
    clean = check(items, records, ["i1 10 1.0"], good, [])
    duplicate = check(items, records, ["i1 10 1.0", "i1 11 1.5"], [*good, "i1 11 1.5 2.5"], [])
    ok = not clean.violations and duplicate.summary["duplicates"] >= 1
    ok = ok and duplicate.summary["overlaps"] == 1 and bool(duplicate.violations)
    print(json.dumps({"self_test": ok, "clean": clean.summary, "duplicate": duplicate.summary}))
    return 0 if ok else 1


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _kill(orphan: str) -> None:
    with contextlib.suppress(ProcessLookupError, ValueError):
        os.kill(int(orphan.split()[1]), signal.SIGKILL)


@contextlib.contextmanager
def scratch_store(kind: str, root: Path, prefix: str) -> Iterator[str]:
    """A fresh store's URL: an SQLite file under ``root``, or a new PostgreSQL database named
    ``<prefix>_<random>``, dropped on exit."""
    if kind == "sqlite":
        yield str(root / "conduit.db")
        return
    database = f"{prefix}_{uuid.uuid4().hex[:10]}"
    url = _create_database(database)
    try:
        yield url
    finally:
        _drop_database(database)


def _create_database(name: str) -> str:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(urlsplit(PG_URL)._replace(path=f"/{name}"))


def _drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument(
        "--store-url", default=None, help="an empty store to use (default: a fresh one)"
    )
    parser.add_argument("--items", type=int, default=150)
    parser.add_argument("--seconds", type=float, default=45.0, help="how long the kills go on")
    parser.add_argument("--kills", type=int, default=0, help="stop the kills after this many")
    parser.add_argument("--min-gap", type=float, default=0.2)
    parser.add_argument("--max-gap", type=float, default=2.5)
    parser.add_argument("--job-seconds", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--settle-seconds", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args(argv)
    if args.self_test:
        return self_test()
    return anyio.run(run, args)


if __name__ == "__main__":
    sys.exit(main())
