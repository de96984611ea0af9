"""Chaos drill: real daemons SIGKILLed at random moments while Work runs, then checked.

    .venv/bin/python bench/chaos_drill.py --store sqlite --items 150 --seconds 45
    .venv/bin/python bench/chaos_drill.py --executor container --items 40 --seconds 30
    .venv/bin/python bench/chaos_drill.py --executor wire --store postgres --kills 500
    .venv/bin/python bench/chaos_drill.py --store postgres --daemons 2 --items 400 --seconds 45

N items are submitted straight into a fresh store, bound to one executor kind (``--executor``:
``shell``, ``container`` or ``wire``, see ``_drill_kinds.py``). Each item's job appends
``<item> <pid> <start>`` to ``starts.log`` as it begins and ``<item> <pid> <start> <end>`` to
``side-effects.log`` as it ends. ``--daemons`` daemons (2 needs PostgreSQL: one store, each
daemon its own data folder and port) run them; one of them, chosen at random, is SIGKILLed
0.2-2.5 s (uniform) after it starts serving, and restarted at once, for ``--seconds`` (or until
``--kills`` kills; past it until ``--min-kills``). A ``--targeted`` share of the kills instead
waits (up to ``--target-wait`` seconds) until the store shows one of the victim's attempts
mid-launch, then kills at once. When ``--seconds`` ends before the kills proved what the checker
asks (below) and some item has not started, targeted kills go on, up to ``--seconds`` more.

A kill *landed mid-launch* when, read from the store after the victim is dead (so nothing more
of it can be written), an unfinished attempt whose lease the victim held at the current epoch
has ``invoke = called`` but no recovery metadata acknowledged in that segment
(``recovery_persisted`` false): the executor was called and wrote something durable (the
invoke mark goes with the launch's first fenced write: a launch phase or the launch intent),
but the launch did not finish. Then one
last round runs until every item has settled and every daemon is stopped with SIGTERM. The
checker asserts, per item: completed, in exactly one attempt, with no failed attempt and no
failure counted (a kill may cost a ``relaunched`` segment, nothing else), started exactly once,
its side effect exactly once, never two runs of it at once; that no job process, wire program
or container of the drill is left; and, when there were kills, that some landed mid-launch and
that attempts were recovered and relaunched (segments flagged so in the store). It prints one
JSON line (kills, kills_mid_launch, recovered_segments, relaunched_segments, duplicates,
burnt_retries, orphans, ...) and exits 1 on any violation, keeping the drill's folder (logs,
the daemons' logs) and printing each violating item's attempts. ``--self-test`` feeds the
checker a log with a duplicate to show it can fail.
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

from conduit_core.model import Event, Execution, ExecutionStatus, Invoke, Work, WorkStatus
from conduit_core.storage import Store, open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _drill_kinds import KINDS, binding, leftovers, remove

PG_URL = os.environ.get(
    "CONDUIT_TEST_PG_URL", "postgresql://root@/postgres?host=/var/run/postgresql"
)
SETTINGS = """\
[settings]
store = "{store}"
data_dir = "{data}"
concurrency = {concurrency}
job_concurrency = {concurrency}
lease_seconds = {lease}
retry_delays_seconds = [0.5, 0.5, 0.5]
http.listen = "127.0.0.1:{port}"
"""
HELD_GIVE_UP_SECONDS = 15.0


@dataclass(frozen=True)
class AttemptFacts:
    attempt: int
    completed: bool
    failure_code: str | None
    relaunched_segments: int
    recovered_segments: int
    hold: str | None = None  # the recovery hold's code while the attempt is held

    @classmethod
    def of(cls, execution: Execution) -> AttemptFacts:
        return cls(
            attempt=execution.attempt,
            completed=execution.status is ExecutionStatus.COMPLETED,
            failure_code=execution.failure_code,
            relaunched_segments=sum(s.relaunched for s in execution.segments),
            recovered_segments=sum(s.recovered for s in execution.segments),
            hold=execution.recovery_hold.code if execution.recovery_hold else None,
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


def launches_proved(kills_mid_launch: int, recovered: int, relaunched: int) -> bool:
    """What kills must prove about launches: one landed mid-launch, and some segment was
    recovered and some relaunched (the verdict asks it; targeted kills go on until it holds)."""
    return bool(kills_mid_launch and recovered and relaunched)


def check(
    items: list[str],
    records: dict[str, ItemRecord],
    starts: list[str],
    side_effects: list[str],
    orphans: list[str],
    *,
    kills: int = 0,
    kills_mid_launch: int = 0,
) -> Verdict:
    """The drill's invariants over what the store and the logs say; pure, so it can be tested.

    With kills, the drill must also have proved something about launches: some kill landed
    mid-launch, and some attempt was recovered and some relaunched."""
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
            codes = [(a.attempt, a.completed, a.failure_code, a.hold) for a in record.attempts]
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
    violations.extend(f"left behind: {o}" for o in orphans)
    if kills and not launches_proved(kills_mid_launch, recovered, relaunched):
        violations.append(
            f"{kills} kills proved too little: {kills_mid_launch} landed mid-launch, "
            f"{recovered} segments recovered, {relaunched} relaunched (each must be > 0)"
        )
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
    return leftovers("shell", prefix)


async def cut_mid_launch(store: Store, pid: int) -> list[str]:
    """The unfinished attempts of the daemon ``pid`` caught mid-launch, as the store says now.

    Its lease at the attempt's current epoch, and that epoch's segment with ``invoke = called``
    (written with the launch's first fenced write: a launch phase or the intent) but no
    recovery metadata acknowledged. Read after ``pid`` is dead, it proves a kill cut a launch
    in the middle.
    """
    cut = []
    for execution in await store.live_executions():
        segment = execution.segments[-1] if execution.segments else None
        if (
            segment is None
            or segment.epoch != execution.epoch
            or segment.invoke is not Invoke.CALLED
            or segment.recovery_persisted
        ):
            continue
        lease = await store.get_lease(execution.id)
        if lease is not None and lease.epoch == execution.epoch and f"/{pid}/" in lease.owner:
            cut.append(f"{execution.id}@{execution.epoch}")
    return cut


class Daemon:
    """One ``conduit daemon`` of the drill: its own config (data folder, port) on the store."""

    def __init__(self, drill: Drill, index: int) -> None:
        self.port = _free_port()
        self.config = drill.root / f"conduit-{index}.toml"
        self.config.write_text(
            SETTINGS.format(
                store=drill.store, data=drill.root / f"data-{index}",
                concurrency=drill.args.concurrency, lease=drill.args.lease, port=self.port,
            ) + drill.binding
        )  # fmt: skip
        self.log = (drill.root / f"daemon-{index}.log").open("ab")
        self.cwd = drill.root
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "conduit_core.cli", "daemon", "--config", str(self.config),
             "--rescan", "0.2"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.cwd,
        )  # fmt: skip

    async def wait_listening(self, seconds: float = 60.0) -> None:
        """Until its HTTP port accepts connections: it has opened its store by then."""
        import socket

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.alive:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            await anyio.sleep(0.05)

    def kill(self) -> bool:
        """SIGKILL it and reap it; whether it was alive to be killed."""
        assert self.process is not None
        alive = self.process.poll() is None
        if alive:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        return alive

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()


class Drill:
    def __init__(self, args: argparse.Namespace, root: Path, store: str) -> None:
        self.args = args
        self.root = root
        self.store = store
        self.prefix = f"drill-{uuid.uuid4().hex[:8]}-"
        self.items = [f"{self.prefix}{n:05}" for n in range(args.items)]
        self.binding = binding(args.executor, root, args.job_seconds, self.prefix)
        self.daemons = [Daemon(self, i) for i in range(args.daemons)]
        self.kills = 0
        self.targeted = 0
        self.mid_launch: list[str] = []  # per kill that cut launches: "kill N: id@epoch, ..."
        self.cut_attempts = 0
        self.progress = (0, time.monotonic())  # items completed, and since when

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

    async def trail(self, item: str) -> str:
        """An item's attempts as the store has them (segments, phases, holds), for a report."""
        import msgspec

        store = await open_store(self.store)
        try:
            return msgspec.json.encode(await store.list_executions(item)).decode()
        finally:
            await store.aclose()

    async def settled(self) -> bool:
        """Every item's Work completed; or some held for ``HELD_GIVE_UP_SECONDS`` while no other
        completed (a hold waits for a person and keeps its slot; the checker reports it). One
        paged read, not one per item."""
        store = await open_store(self.store)
        try:
            completed, after = 0, None
            while page := await store.list_work(
                status=WorkStatus.COMPLETED, limit=500, after=after
            ):
                completed += sum(w.id.startswith(self.prefix) for w in page)
                after = page[-1].id
            if completed >= len(self.items):
                return True
            now = time.monotonic()
            if completed != self.progress[0]:
                self.progress = (completed, now)
                return False
            now_ms = int(time.time() * 1000)
            held = [
                e for e in await store.held_recoveries()
                if e.work_id.startswith(self.prefix) and e.recovery_hold is not None
                and now_ms - e.recovery_hold.since_ms > HELD_GIVE_UP_SECONDS * 1000
            ]  # fmt: skip
            return bool(held) and now - self.progress[1] > HELD_GIVE_UP_SECONDS
        finally:
            await store.aclose()

    async def chaos(self, rng: random.Random) -> None:
        deadline = time.monotonic() + self.args.seconds
        store = await open_store(self.store)
        try:
            for daemon in self.daemons:
                daemon.start()
            while await self.kills_go_on(deadline):
                proving = time.monotonic() >= deadline  # past --seconds, still unproven
                victim = rng.choice(self.daemons)
                # The gap counts from the moment the daemon serves, so the kills land in its
                # work (recovery, claims, launches) rather than in the interpreter's start-up.
                await victim.wait_listening()
                if proving or rng.random() < self.args.targeted:
                    self.targeted += 1
                    await self.until_mid_launch(store, victim)
                else:
                    await anyio.sleep(rng.uniform(self.args.min_gap, self.args.max_gap))
                assert victim.process is not None
                pid = victim.process.pid
                if victim.kill():
                    self.kills += 1
                    cut = await cut_mid_launch(store, pid)
                    if cut:
                        self.cut_attempts += len(cut)
                        self.mid_launch.append(f"kill {self.kills}: {', '.join(cut)}")
                victim.start()
        finally:
            await store.aclose()

    async def kills_go_on(self, deadline: float) -> bool:
        """Until ``--seconds`` (and ``--min-kills``), at most ``--kills``; then, while the kills
        have not yet proved what the verdict asks (one landed mid-launch, segments recovered and
        relaunched) and some item has not started, targeted kills go on for up to ``--seconds``
        more: a short drill whose random kills all missed would otherwise end unproven."""
        if self.args.kills and self.kills >= self.args.kills:
            return False
        now = time.monotonic()
        if now < deadline or self.kills < self.args.min_kills:
            return True
        if now > deadline + self.args.seconds or not self.kills:
            return False
        if len(self.lines("starts.log")) >= len(self.items):
            return False  # nothing left to launch: more kills cannot land mid-launch
        return not await self.proved()

    async def proved(self) -> bool:
        attempts = [a for r in (await self.records()).values() for a in r.attempts]
        return launches_proved(
            len(self.mid_launch),
            sum(a.recovered_segments for a in attempts),
            sum(a.relaunched_segments for a in attempts),
        )

    async def until_mid_launch(self, store: Store, victim: Daemon) -> None:
        """Until the store shows one of ``victim``'s attempts mid-launch (or a deadline)."""
        assert victim.process is not None
        deadline = time.monotonic() + self.args.target_wait
        while time.monotonic() < deadline and victim.alive:
            if await cut_mid_launch(store, victim.process.pid):
                return
            await anyio.sleep(0.005)

    async def finish(self) -> None:
        for daemon in self.daemons:
            if not daemon.alive:
                daemon.start()
        deadline = time.monotonic() + self.args.settle_seconds
        while not await self.settled():
            if time.monotonic() > deadline:
                break
            for daemon in self.daemons:
                if not daemon.alive:
                    daemon.start()  # a last daemon that died on its own is restarted too
            await anyio.sleep(0.5)
        for daemon in self.daemons:
            daemon.stop()

    def lines(self, name: str) -> list[str]:
        path = self.root / name
        return path.read_text().splitlines() if path.exists() else []


async def run(args: argparse.Namespace) -> int:
    if args.daemons > 1 and args.store != "postgres":
        print("--daemons above 1 needs --store postgres", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    root = Path(tempfile.mkdtemp(prefix="conduit-drill-"))
    fresh = (
        contextlib.nullcontext(args.store_url)
        if args.store_url
        else scratch_store(args.store, root, "conduit_drill")
    )
    with fresh as store:
        drill = Drill(args, root, store)
        await drill.submit()
        started = time.monotonic()
        await drill.chaos(random.Random(seed))
        chaos_seconds = time.monotonic() - started
        started_in_chaos = len(drill.lines("starts.log"))
        await drill.finish()
        left = leftovers(args.executor, drill.prefix)
        verdict = check(
            drill.items, await drill.records(), drill.lines("starts.log"),
            drill.lines("side-effects.log"), left, kills=drill.kills,
            kills_mid_launch=len(drill.mid_launch),
        )  # fmt: skip
        for leftover in left:
            remove(leftover)
        bad = sorted({v.split(":")[0] for v in verdict.violations if v.startswith(drill.prefix)})
        trails = [f"{item}: {await drill.trail(item)}" for item in bad[:5]]
    summary = {
        "executor": args.executor, "store": args.store, "daemons": args.daemons, "seed": seed,
        "kills": drill.kills, "targeted_kills": drill.targeted,
        "kills_mid_launch": len(drill.mid_launch), "attempts_cut_mid_launch": drill.cut_attempts,
        **verdict.summary,
        "chaos_seconds": round(chaos_seconds, 1), "started_during_kills": started_in_chaos,
        "total_seconds": round(time.monotonic() - started, 1),
        "violations": len(verdict.violations), "ok": not verdict.violations,
    }  # fmt: skip
    for line in [*verdict.violations[:20], *trails]:
        print(line, file=sys.stderr)
    if any("proved too little" in v for v in verdict.violations) and started_in_chaos >= len(
        drill.items
    ):
        print(
            f"every item had started by the time the kills could land in a launch: run more "
            f"--items (or fewer --daemons); {len(drill.items)} were too few here",
            file=sys.stderr,
        )
    if verdict.violations:
        (root / "kills-mid-launch.txt").write_text("\n".join(drill.mid_launch) + "\n")
        print(f"kept the drill's folder: {root}", file=sys.stderr)
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
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
    parser.add_argument("--executor", choices=KINDS, default="shell")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--daemons", type=int, default=1, help="on one store (2: PostgreSQL)")
    parser.add_argument(
        "--store-url", default=None, help="an empty store to use (default: a fresh one)"
    )
    parser.add_argument("--items", type=int, default=150)
    parser.add_argument("--seconds", type=float, default=45.0, help="how long the kills go on")
    parser.add_argument("--kills", type=int, default=0, help="stop the kills after this many")
    parser.add_argument(
        "--min-kills", type=int, default=0, help="go on past --seconds until this many kills"
    )
    parser.add_argument("--min-gap", type=float, default=0.2)
    parser.add_argument("--max-gap", type=float, default=2.5)
    parser.add_argument(
        "--targeted", type=float, default=0.5,
        help="share of the kills that wait for an attempt mid-launch, then kill at once",
    )  # fmt: skip
    parser.add_argument("--target-wait", type=float, default=3.0)
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
