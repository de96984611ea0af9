"""Jobs per second and insert → start latency through the daemon a user runs, beside Procrastinate.

    .venv/bin/python bench/bench_daemon.py --rate 100 300 --workers 8          # steady, ~2 min
    .venv/bin/python bench/bench_daemon.py --mode backlog --seconds 30
    .venv/bin/python bench/bench_daemon.py --mode kill --kill-every 10 --seconds 60
    .venv/bin/python bench/bench_daemon.py --store postgres --mode pg-down
    .venv/bin/python bench/bench_daemon.py --find-max --rate 100
    .venv/bin/python bench/bench_daemon.py --mode backlog --find-max --rate 100
    .venv/bin/python bench/bench_daemon.py --rate 300 --foreign 50000          # a foreign backlog
    .venv/bin/python bench/bench_daemon.py --rate 300 --key-backlog 20000      # one key's backlog
    .venv/bin/python bench/bench_daemon.py --rate 300 --scope-backlog 20000    # a full scope's

Each system runs in turn, fresh, in the same invocation: ``conduit daemon`` as a subprocess (a
generated config on a fresh SQLite file, then a fresh PostgreSQL database), then Procrastinate's
own worker as a subprocess on a fresh database (``--peer-python``: a venv with the peers'
requirements; see bench/README.md). A producer offers jobs at a fixed rate, credited on
wall-clock time, in batches every 25 ms (conduit: ``POST /v1/work/batch``; Procrastinate:
``batch_defer_async``). The job is in-process in both: conduit's test-plugin ``echo`` executor
(``sleep_ms`` in its binding config), Procrastinate's ``async def`` task; each appends
``<id> <t0> <start>`` to a start log when it starts and then sleeps ``--job-ms``. So the figures
are the scheduler's (claim, lease, settle, its store), not the cost of forking a job.

Every ``--window`` seconds one line (stderr): offered and finished jobs/s, queue depth (stored,
not started), insert → start p50/p95/p99 (t0 is taken just before the insert; log-bucketed
histograms, bounded memory), and on PostgreSQL the dead tuples (``pg_stat_user_tables``). Per
result one JSON line (stdout), as the peers' harness prints; then the ratios to Procrastinate.

Modes: ``steady`` (the offered rate), ``backlog`` (keep ~``--depth`` jobs queued: the drain rate
under a standing backlog), ``kill`` (SIGKILL the daemon every ``--kill-every`` s and restart it at
once; conduit only), ``pg-down`` (PostgreSQL crash-stopped for 10 s a third of the way in, then
started again: each system's database is on a private server of its own, started for the run by
``tests/faults/_pgserver.py`` with fsync off, so nothing else on the machine loses its server;
its figures are for recovery, not comparable with the shared cluster's). After
the producer stops, the run waits for the queue to drain and counts jobs lost (stored, never
finished) and run twice (two starts of one id).

Then issue 32's targets, each with what was measured and a verdict (a table on stderr, one JSON
line each on stdout; ``_daemon_targets.py``): with ``--find-max``, the highest sustained rates'
ratios, p99 at Procrastinate's highest rate (each conduit store is run once more at exactly
that rate when its own steps missed it) and dead rows per job; with ``--mode backlog
--find-max``, each system's backlog drain against its own highest sustained rate; with ``--mode
kill`` or ``pg-down``, the time back at the offered rate after each fault, lost and run twice.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _daemon_targets import (
    KEEPS_UP,
    back_at_rate_after,
    backlog_targets,
    fault_targets,
    find_max_targets,
    highest_sustained,
    print_targets,
)
from _load import Histogram, Producer, StartLog

from conduit_core.http import ApiClient, BatchSubmitRequest, BatchSubmitResult, SubmitRequest

PG_ADMIN = os.environ.get(
    "CONDUIT_BENCH_PG_URL", "postgresql://root@/postgres?host=/var/run/postgresql"
)
HERE = Path(__file__).resolve().parent
#: Seconds without a job finishing, after the producer stopped, that count what is left as lost.
STALL_S = 10.0

CONFIG = """\
[settings]
store = "{store}"
data_dir = "{data}"
concurrency = {workers}
job_concurrency = {workers}
lease_seconds = 30
http.listen = "127.0.0.1:{port}"

[bindings.noop]
executor = "echo"
config = {{ sleep_ms = {job_ms}, start_log = "{start_log}" }}
{idle_pool}"""

#: ``--idle-pool``: a binding in a second pool that no job is submitted to, so the daemon's
#: claims read the queue pool by pool, as a daemon with in-process and shell bindings does.
IDLE_POOL = """
[bindings.idle]
executor = "shell"
config = { command = "true" }
"""


#: ``--key-backlog``: a binding whose Work run one at a time per customer (its own start log).
KEYED_BINDING = """
[bindings.keyed]
executor = "echo"
config = {{ sleep_ms = {job_ms}, start_log = "{start_log}" }}
concurrency_key = "{{customer}}"
key_limit = 1
"""

#: ``--scope-backlog``: a binding whose Work run in a scope limited to one at a time (its own
#: start log); its backlog is queued ahead of every job, the scope full while one of it runs.
SCOPED_BINDING = """
[scopes.big]
limits.concurrency = 1

[bindings.scoped]
executor = "echo"
scope = "big"
config = {{ sleep_ms = {job_ms}, start_log = "{start_log}" }}
"""


def fill_ahead(url: str, count: int, prefix: str, **fields: object) -> None:
    """``count`` ready Work (``fields`` set on each), queued ahead of every job: ``--foreign``,
    of a binding the daemon does not have (another daemon's backlog on a shared store, or a
    binding since removed); ``--key-backlog``, of one customer of the keyed binding, which
    runs them one at a time beside the jobs."""
    import anyio
    import msgspec

    from conduit_core.storage import open_store
    from conduit_core.storage.conformance import make_input as make_event
    from conduit_core.storage.conformance import make_work

    def make_input(n: str) -> object:
        return msgspec.structs.replace(make_event(n), payload={"customer": "big"})

    async def fill() -> None:
        async with await open_store(url) as store:
            for first in range(0, count, 5_000):
                await store.create_works([
                    (msgspec.structs.replace(make_work(f"{prefix}-{n:07}"), **fields),
                     make_input(f"{prefix}-{n:07}"))
                    for n in range(first, min(count, first + 5_000))
                ])  # fmt: skip

    anyio.run(fill)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def launch_daemon(
    root: Path,
    config: Path,
    port: int,
    *,
    env: dict[str, str] | None = None,
    client_timeout: float = 10.0,
) -> tuple[subprocess.Popen[bytes], ApiClient]:
    """``conduit daemon --config CONFIG`` in ``root`` (its log: ``root/daemon.log``; its data
    folder ``root/data``), once it answers on ``port``; with an API client."""
    with (root / "daemon.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "conduit_core.cli", "daemon", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, cwd=root, env=env,
        )  # fmt: skip
    token_file = root / "data" / "token"
    wait_until("the daemon's token", token_file.exists, 30)
    client = ApiClient(
        token_file.read_text().strip(), listen=f"127.0.0.1:{port}", timeout=client_timeout
    )

    def answers() -> bool:
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited: see {root / 'daemon.log'}")
        try:
            client.request("GET", "/v1/health", None, dict)
        except Exception:
            return False
        return True

    wait_until("the daemon to answer", answers, 30)
    return proc, client


def stop_daemon(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM, and SIGKILL if it has not exited within ``grace`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class FreshDatabase:
    """A PostgreSQL database for one run, dropped afterwards; ``private``: on a server of its
    own (a pg-down run stops it), destroyed afterwards."""

    def __init__(self, prefix: str, *, private: bool = False) -> None:
        import psycopg

        self.name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        self.server: Any = None
        if private:
            sys.path.insert(0, str(HERE.parent / "tests" / "faults"))
            from _pgserver import PrivateServer  # type: ignore[import-not-found]

            self.server = PrivateServer()
            self.server.init()
            self.url = self.server.create_database(self.name)
            self._conn: Any = None
            return
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.name}"')
        base, _, query = PG_ADMIN.partition("?")
        self.url = base.rsplit("/", 1)[0] + f"/{self.name}" + (f"?{query}" if query else "")
        self._conn = None

    def scalar(self, sql: str) -> int:
        import psycopg

        if self._conn is None:
            self._conn = psycopg.connect(self.url, autocommit=True)
        try:
            row = self._conn.execute(sql).fetchone()
        except psycopg.Error:
            self._conn = None  # the server went away (pg-down): reconnect next time
            raise
        return int(row[0] or 0)

    def dead_tuples(self) -> int | None:
        try:
            return self.scalar("SELECT sum(n_dead_tup) FROM pg_stat_user_tables")
        except Exception:
            return None

    def churn(self) -> tuple[int, int] | None:
        """Row versions made dead so far, whatever autovacuum has cleaned since: every update
        and delete, and those not heap-only (a HOT update's old version is pruned in place)."""
        try:
            both = self.scalar("SELECT sum(n_tup_upd + n_tup_del) FROM pg_stat_user_tables")
            cold = self.scalar(
                "SELECT sum(n_tup_upd - n_tup_hot_upd + n_tup_del) FROM pg_stat_user_tables"
            )
        except Exception:
            return None
        return both, cold

    def commits(self) -> int | None:
        """Transactions committed in the database so far (every system's, the bench's few reads
        included): per finished job, the synced commits one job costs."""
        try:
            return self.scalar(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
        except Exception:
            return None

    def churn_by_table(self) -> dict[str, int]:
        """``churn``'s row versions made dead so far per table, all and not heap-only."""
        import psycopg

        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                rows = conn.execute(
                    "SELECT relname, n_tup_upd + n_tup_del, n_tup_upd - n_tup_hot_upd + n_tup_del "
                    "FROM pg_stat_user_tables WHERE n_tup_upd + n_tup_del > 0 ORDER BY 2 DESC"
                ).fetchall()
        except psycopg.Error:
            return {}
        return {f"{name}{suffix}": int(n) for name, made, cold in rows
                for suffix, n in (("", made), (" not hot", cold))}  # fmt: skip

    def drop(self) -> None:
        import psycopg

        if self._conn is not None:
            self._conn.close()
        if self.server is not None:
            self.server.destroy()
            return
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class ConduitSystem:
    """``conduit daemon`` on a generated config; the producer submits over HTTP in batches."""

    def __init__(self, store: str, root: Path, args: argparse.Namespace) -> None:
        self.kind = store
        self.root = root
        self.start_log = str(root / "starts.log")
        self.faults_at: list[float] = []  # wall-clock: each SIGKILL, the server's return
        private = args.mode == "pg-down"
        self.db = FreshDatabase("conduit_bench", private=private) if store == "postgres" else None
        self.sqlite_path = root / "conduit.db"
        self.port = free_port()
        self.config = root / "conduit.toml"
        self.config.write_text(
            CONFIG.format(
                store=self.db.url if self.db else self.sqlite_path, data=root / "data",
                workers=args.workers, port=self.port, job_ms=args.job_ms,
                start_log=self.start_log, idle_pool=IDLE_POOL if args.idle_pool else "",
            )
            + (KEYED_BINDING.format(job_ms=args.job_ms, start_log=root / "keyed-starts.log")
               if args.key_backlog else "")
            + (SCOPED_BINDING.format(job_ms=args.job_ms, start_log=root / "scoped-starts.log")
               if args.scope_backlog else "")
        )  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: ApiClient | None = None
        self.producer: Producer | None = None
        url = self.db.url if self.db else f"sqlite://{self.sqlite_path}"
        if args.foreign:
            fill_ahead(url, args.foreign, "foreign", binding="foreign")
        if args.key_backlog:
            fill_ahead(url, args.key_backlog, "keyed", binding="keyed", concurrency_key="big",
                       key_limit=1)  # fmt: skip
        if args.scope_backlog:
            fill_ahead(url, args.scope_backlog, "scoped", binding="scoped", scope="big")

    @property
    def name(self) -> str:
        return f"conduit-{self.kind}"

    def backlog_started(self, which: str) -> int:
        """``--key-backlog`` (``keyed``), ``--scope-backlog`` (``scoped``): how many of that
        backlog's Work have started so far."""
        log = self.root / f"{which}-starts.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def start(self) -> None:
        # The test plugin's two start gates are then asked only about Work that names them, as a
        # user's gates select some Work (no gate is asked in this bench).
        env = {**os.environ, "CONDUIT_TEST_PLUGIN_GATES": "selected"}
        self.proc, self.client = launch_daemon(self.root, self.config, self.port, env=env)

    def submit(self, batch: list[tuple[str, float]]) -> None:
        assert self.client is not None
        items = [SubmitRequest(binding="noop", id=job_id, input={"t": t0}) for job_id, t0 in batch]
        req = BatchSubmitRequest(items=items)
        result = self.client.request("POST", "/v1/work/batch", req, BatchSubmitResult)
        wrong = [i for i in result.items if not i.created and i.code != "work_exists"]
        if wrong:
            raise RuntimeError(f"refused: {wrong[0].code}: {wrong[0].error}")

    def produce(self, args: argparse.Namespace, rate: float) -> threading.Thread:
        backlog = args.depth if args.mode == "backlog" else None
        starts, seen = StartLog(self.start_log), [0]

        def started() -> int:  # the producer's own count, fresh every tick
            seen[0] += len(starts.read())
            return seen[0]

        self.producer = Producer(self.submit, rate=rate, backlog=backlog, started=started)
        producer = self.producer

        def run() -> None:
            producer.run(args.seconds)
            producer.flush(30)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def counters(self) -> tuple[int, int]:
        assert self.producer is not None
        return self.producer.offered, self.producer.submitted

    def finished(self) -> int | None:
        sql = "SELECT count(*) FROM conduit_work WHERE status = 'completed'"
        try:
            if self.db:
                return self.db.scalar(sql)
            with sqlite3.connect(f"file:{self.sqlite_path}?mode=ro", uri=True, timeout=5) as c:
                return int(c.execute(sql).fetchone()[0])
        except Exception:
            return None

    def kill_and_restart(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        self.start()

    def stop(self) -> None:
        if self.producer is not None:
            self.producer.stop.set()
        if self.proc is not None:
            stop_daemon(self.proc)
        if self.db:
            self.db.drop()


class ProcrastinateSystem:
    """Procrastinate's worker and producer, each a process of the peers' venv."""

    name = "procrastinate"

    def __init__(self, root: Path, args: argparse.Namespace) -> None:
        self.root = root
        self.python = args.peer_python
        self.start_log = str(root / "starts.log")
        self.faults_at: list[float] = []  # wall-clock: the server's return (pg-down)
        self.counters_file = root / "counters.json"
        self.db = FreshDatabase("proc_bench", private=args.mode == "pg-down")
        self.args = args
        self.procs: list[subprocess.Popen[bytes]] = []
        self._side([*self._base("schema")], wait=True)

    def _base(self, what: str) -> list[str]:
        return [self.python, str(HERE / "_peer_procrastinate.py"), what, "--db", self.db.name,
                "--start-log", self.start_log]  # fmt: skip

    def _side(self, command: list[str], *, wait: bool = False) -> None:
        env = dict(os.environ)
        if self.db.server is not None:  # a private server: its socket folder and port
            env |= {"BENCH_PG_HOST": str(self.db.server.socket_dir),
                    "BENCH_PG_PORT": self.db.server.url().rsplit("port=", 1)[1]}  # fmt: skip
        with (self.root / "procrastinate.log").open("ab") as log:
            proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, cwd=HERE, env=env
            )
        if wait:
            if proc.wait(60) != 0:
                raise SystemExit(f"{command[2]} failed: see {self.root / 'procrastinate.log'}")
        else:
            self.procs.append(proc)

    def start(self) -> None:
        ready = self.root / "worker.ready"
        self._side([*self._base("worker"), "--concurrency", str(self.args.workers),
                    "--job-ms", str(self.args.job_ms), "--ready", str(ready)])  # fmt: skip
        wait_until("Procrastinate's worker", ready.exists, 60)

    def produce(self, args: argparse.Namespace, rate: float) -> None:
        extra = ["--backlog", str(args.depth)] if args.mode == "backlog" else []
        self._side([*self._base("produce"), "--rate", str(rate), "--seconds", str(args.seconds),
                    "--counters", str(self.counters_file), *extra])  # fmt: skip
        wait_until("Procrastinate's producer", self.counters_file.exists, 60)

    def counters(self) -> tuple[int, int]:
        try:
            data = json.loads(self.counters_file.read_text())
        except (FileNotFoundError, ValueError):
            return 0, 0
        return int(data["offered"]), int(data["submitted"])

    def finished(self) -> int | None:
        try:
            return self.db.scalar(
                "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            )
        except Exception:
            return None

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.db.drop()


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def measure(system: Any, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``system`` at ``rate``: windows on stderr, the result as a dict."""
    starts = StartLog(system.start_log)
    started_total = {"n": 0}
    system.start()
    producer = system.produce(args, rate)
    t_begin = time.monotonic()
    disruptor = disrupt(system, args, t_begin)
    steady = Histogram()  # every window but the first (warm-up)
    windows: list[dict[str, Any]] = []
    prev_offered = prev_finished = 0
    finished_at_warm: tuple[float, int] | None = None
    while True:
        time.sleep(max(0.0, t_begin + (len(windows) + 1) * args.window - time.monotonic()))
        now = time.monotonic() - t_begin
        window = Histogram()
        for _, ms in starts.read():
            window.add(ms)
            started_total["n"] += 1
        if windows:
            steady.merge(window)
        offered, submitted = system.counters()
        finished = system.finished()
        finished_now = finished if finished is not None else prev_finished
        dead = system.db.dead_tuples() if system.db else None
        row = {
            "t": round(now), "offered_per_s": (offered - prev_offered) / args.window,
            "finished_per_s": (finished_now - prev_finished) / args.window,
            "depth": max(0, submitted - started_total["n"]), "p50": window.percentile(50),
            "p95": window.percentile(95), "p99": window.percentile(99), "dead_tuples": dead,
        }  # fmt: skip
        windows.append(row)
        print(
            f"  {system.name:18} t={row['t']:>4}s offered {row['offered_per_s']:7.1f}/s "
            f"finished {row['finished_per_s']:7.1f}/s depth {row['depth']:6} "
            f"p50/p95/p99 {fmt(row['p50'])}/{fmt(row['p95'])}/{fmt(row['p99'])} ms"
            + (f" dead {dead}" if dead is not None else "")
            + (f" unsent {offered - submitted}" if offered > submitted else ""),
            file=sys.stderr, flush=True,
        )  # fmt: skip
        prev_offered, prev_finished = offered, finished_now
        if len(windows) == 1:
            finished_at_warm = (now, finished_now)
        if now >= args.seconds - 0.01:
            break
    assert finished_at_warm is not None
    t_warm, f_warm = finished_at_warm
    offered, submitted = system.counters()
    finished_rate = (prev_finished - f_warm) / max(1e-9, now - t_warm)
    dead_at_end = system.db.dead_tuples() if system.db else None
    if isinstance(producer, threading.Thread):
        producer.join(40)
    if disruptor is not None:
        disruptor.join(30)
    # Drain: wait until every stored job finished, or nothing finished for STALL_S (then the
    # rest is lost), or --drain passed while jobs still finish (then nothing is concluded).
    drain_deadline = time.monotonic() + args.drain
    finished_end, progress_at, stalled = prev_finished, time.monotonic(), False
    while time.monotonic() < drain_deadline:
        offered, submitted = system.counters()
        done = system.finished()
        if done is not None and done > finished_end:
            finished_end, progress_at = done, time.monotonic()
        if finished_end >= submitted and submitted >= offered:
            break
        if time.monotonic() - progress_at > STALL_S:
            stalled = True
            break
        time.sleep(0.2)
    starts.read()
    unfinished = max(0, submitted - finished_end)
    churn = None
    if system.db is not None and finished_end:
        time.sleep(1.5)  # backends report their counts at most once a second
        made = system.db.churn()
        commits = system.db.commits()
        if made is not None:
            by_table = system.db.churn_by_table()
            churn = {"dead_made_per_job": round(made[0] / finished_end, 2),
                     "non_hot_dead_per_job": round(made[1] / finished_end, 2),
                     "commits_per_job": None if commits is None
                     else round(commits / finished_end, 2),
                     "dead_per_job_by_table": {name: round(n / finished_end, 2)
                                               for name, n in by_table.items()}}  # fmt: skip
    return {
        "peer": system.name.split("-")[0], "store": getattr(system, "kind", "postgres"),
        "mode": args.mode, "offered_per_s": None if args.mode == "backlog" else rate,
        "depth_target": args.depth if args.mode == "backlog" else None,
        "workers": args.workers, "job_ms": args.job_ms,
        "seconds": args.seconds, "finished_per_s": round(finished_rate, 1),
        "load_average": round(os.getloadavg()[0], 1),
        "p50_ms": _round(steady.percentile(50)), "p95_ms": _round(steady.percentile(95)),
        "p99_ms": _round(steady.percentile(99)), "max_depth": max(w["depth"] for w in windows),
        "end_depth": windows[-1]["depth"], "dead_tuples_at_end": dead_at_end,
        "dead_tuples_peak": max((w["dead_tuples"] or 0 for w in windows), default=None)
        if dead_at_end is not None else None,
        **(churn or {}),
        "submitted": submitted, "unfinished_after_drain": unfinished,
        "lost": unfinished if stalled or not unfinished else None,
        "ran_twice": starts.twice(), "windows": windows,
        **({"key_backlog_started": system.backlog_started("keyed")}
           if args.key_backlog and isinstance(system, ConduitSystem) else {}),
        **({"scope_backlog_started": system.backlog_started("scoped")}
           if args.scope_backlog and isinstance(system, ConduitSystem) else {}),
        **({"resumed_after_s": resumed_after(system)} if args.mode == "pg-down" else {}),
        **({"back_at_rate_after_s": back_at_rate_after(start_times(system), system.faults_at,
                                                       rate)}
           if args.mode in ("kill", "pg-down") else {}),
    }  # fmt: skip


def start_times(system: Any) -> list[float]:
    """Every job's wall-clock start, from the system's start log."""
    with open(system.start_log) as log:
        return [float(parts[2]) for line in log if len(parts := line.split()) == 3]


def resumed_after(system: Any) -> float | None:
    """Seconds from the server accepting connections again to the first job started after."""
    restored = getattr(system, "restored_at", None)
    if restored is None:
        return None
    later = [t for t in start_times(system) if t >= restored]
    return round(min(later) - restored, 2) if later else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def disrupt(system: Any, args: argparse.Namespace, t_begin: float) -> threading.Thread | None:
    """The fault of the mode, in a thread: SIGKILL and restart the daemon every K s, or stop
    PostgreSQL for 10 s a third of the way in."""
    if args.mode == "kill" and isinstance(system, ConduitSystem):

        def kill() -> None:
            n = 1
            while t_begin + n * args.kill_every < t_begin + args.seconds - 1:
                time.sleep(max(0.0, t_begin + n * args.kill_every - time.monotonic()))
                print(f"  {system.name}: SIGKILL, restart", file=sys.stderr, flush=True)
                system.faults_at.append(time.time())
                system.kill_and_restart()
                n += 1

        thread = threading.Thread(target=kill, daemon=True)
    elif args.mode == "pg-down" and system.db is not None:

        def outage() -> None:
            time.sleep(args.seconds / 3)
            print(f"  {system.name}: PostgreSQL stopped for 10 s", file=sys.stderr, flush=True)
            system.db.server.stop()
            time.sleep(10)
            system.db.server.start()  # returns once the server accepts connections
            system.restored_at = time.time()
            system.faults_at.append(system.restored_at)
            print(f"  {system.name}: PostgreSQL started", file=sys.stderr, flush=True)

        thread = threading.Thread(target=outage, daemon=True)
    else:
        return None
    thread.start()
    return thread


def systems(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """(name, factory) of each system to run, in order."""
    out: list[tuple[str, Any]] = [
        (f"conduit-{s}", lambda root, s=s: ConduitSystem(s, root, args)) for s in args.store
    ]
    if args.peer_python and args.mode != "kill":
        out.append(("procrastinate", lambda root: ProcrastinateSystem(root, args)))
    return out


def run_one(factory: Any, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_daemon_") as tmp:
        system = factory(Path(tmp))
        try:
            result = measure(system, rate, args)
        finally:
            system.stop()
    windows = result.pop("windows")
    if args.windows_json:
        result["windows"] = windows
    print(json.dumps(result), flush=True)
    return result


def find_max(
    factory: Any, args: argparse.Namespace
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """From ``--rate``, step the offered rate up by a quarter while finished ≥ 98 % of offered
    (or down by a fifth until it is), then ``--refine`` halvings of the last step, at a steady
    rate whatever ``--mode``; print the highest sustained rate. Returns that summary and every
    run's result."""
    args = argparse.Namespace(**{**vars(args), "mode": "steady"})
    runs: list[dict[str, Any]] = []

    def sustains(rate: float) -> bool:
        runs.append(run_one(factory, rate, args))
        return bool(runs[-1]["finished_per_s"] >= KEEPS_UP * rate)

    best = highest_sustained(args.rate[0], sustains, args.refine)
    at_best = next((r for r in runs if r["offered_per_s"] == best), None)
    summary = {"peer": runs[-1]["peer"], "store": runs[-1]["store"], "find_max": True,
               "max_sustained_per_s": best,
               "p99_ms_at_max": at_best["p99_ms"] if at_best else None}  # fmt: skip
    print(json.dumps(summary), flush=True)
    return summary, runs


def at_peer_rate(
    summaries: list[dict[str, Any]], runs: list[dict[str, Any]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each conduit store once more at exactly Procrastinate's highest sustained rate, where its
    find-max steps missed that rate: the p99 target compares the two at that load (a conduit
    step above it, near conduit's own limit, measured more load than Procrastinate had)."""
    peer = next((s for s in summaries if s["peer"] == "procrastinate"), None)
    if peer is None or not peer["max_sustained_per_s"]:
        return []
    rate = peer["max_sustained_per_s"]
    steady = argparse.Namespace(**{**vars(args), "mode": "steady"})
    added = []
    for name, factory in systems(args):
        store = name.removeprefix("conduit-")
        if name == store or any(r["peer"] == "conduit" and r["store"] == store
                                and r["offered_per_s"] == rate for r in runs):  # fmt: skip
            continue
        print(f"{name} (at Procrastinate's highest rate, {rate}/s):", file=sys.stderr, flush=True)
        added.append(run_one(factory, rate, steady))
    return added


def print_ratios(results: list[dict[str, Any]]) -> None:
    peer = {(r["round"], r["offered_per_s"]): r for r in results if r["peer"] == "procrastinate"}
    if not peer:
        return
    print("\n| system | offered/s | finished/s | ratio to Procrastinate | p50 / p99 ms | "
          "Procrastinate p50 / p99 ms | dead rows per job, conduit / Procrastinate (ratio) |",
          file=sys.stderr)  # fmt: skip
    print("|---|---|---|---|---|---|---|", file=sys.stderr)
    for r in results:
        p = peer.get((r["round"], r["offered_per_s"]))
        if p is None or r["peer"] == "procrastinate":
            continue
        ratio = r["finished_per_s"] / p["finished_per_s"] if p["finished_per_s"] else None
        mine, theirs = r.get("dead_made_per_job"), p.get("dead_made_per_job")
        dead = f"{mine} / {theirs} ({mine / theirs:.2f})" if mine and theirs else "-"
        print(
            f"| conduit {r['store']} | {r['offered_per_s'] or 'backlog'} | {r['finished_per_s']} | "
            f"{fmt(ratio) if ratio is None else f'{ratio:.2f}'} | {r['p50_ms']} / {r['p99_ms']} "
            f"| {p['p50_ms']} / {p['p99_ms']} | {dead} |",
            file=sys.stderr,
        )
        print(json.dumps({"ratio_to": "procrastinate", "store": r["store"], "mode": r["mode"],
                          "offered_per_s": r["offered_per_s"], "finished_ratio": ratio and
                          round(ratio, 2)}), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", nargs="+", choices=["sqlite", "postgres"],
                        default=["sqlite", "postgres"])  # fmt: skip
    parser.add_argument("--rate", type=float, nargs="+", default=[100.0, 300.0])
    parser.add_argument("--workers", type=int, default=8, help="job_concurrency / concurrency")
    parser.add_argument("--job-ms", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=20.0, help="producing time per run")
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--drain", type=float, default=90.0, help="max wait for the queue after")
    parser.add_argument("--rounds", type=int, default=1, help="repeat every run, interleaved")
    parser.add_argument("--mode", choices=["steady", "backlog", "kill", "pg-down"],
                        default="steady")  # fmt: skip
    parser.add_argument("--depth", type=int, default=1000, help="backlog mode's queue depth")
    parser.add_argument("--idle-pool", action="store_true",
                        help="conduit: one more binding, in a second pool, never submitted to")
    parser.add_argument("--foreign", type=int, default=0,
                        help="conduit: this many ready Work of a binding the daemon lacks, "
                        "queued ahead of every job")  # fmt: skip
    parser.add_argument("--key-backlog", type=int, default=0,
                        help="conduit: this many ready Work of one concurrency key (limit 1) "
                        "queued ahead of every job, run one at a time beside them")  # fmt: skip
    parser.add_argument("--scope-backlog", type=int, default=0,
                        help="conduit: this many ready Work of a scope limited to 1, queued "
                        "ahead of every job, run one at a time beside them")  # fmt: skip
    parser.add_argument("--kill-every", type=float, default=10.0)
    parser.add_argument("--find-max", action="store_true")
    parser.add_argument("--refine", type=int, default=2, help="find-max: halvings of the last step")
    parser.add_argument("--peer-python", default=os.environ.get("BENCH_PEER_PYTHON"),
                        help="python of a venv with the peers' requirements")  # fmt: skip
    parser.add_argument("--windows-json", action="store_true", help="windows in the JSON too")
    args = parser.parse_args()
    if args.mode == "pg-down":
        args.store = [s for s in args.store if s == "postgres"]
    if not args.peer_python:
        print("note: no --peer-python (or BENCH_PEER_PYTHON): Procrastinate is not run",
              file=sys.stderr)  # fmt: skip
    results: list[dict[str, Any]] = []
    if args.find_max:
        summaries, runs = [], []
        for name, factory in systems(args):
            print(f"{name}:", file=sys.stderr, flush=True)
            summary, tried = find_max(factory, args)
            summaries.append(summary)
            runs += tried
        runs += at_peer_rate(summaries, runs, args)
        if args.mode != "backlog":
            print_targets(find_max_targets(summaries, runs))
            return
        # --mode backlog --find-max: each system's backlog drain against its highest rate.
        for name, factory in systems(args):
            print(f"{name} (backlog):", file=sys.stderr, flush=True)
            results.append(run_one(factory, 0.0, args))
        print_targets(find_max_targets(summaries, runs) + backlog_targets(summaries, results))
        return
    # Interleaved: every system at one rate, then the next rate, so the machine's other load
    # hits them alike. A backlog run offers what keeps the queue at --depth: one rate.
    for round_ in range(1, args.rounds + 1):
        for rate in [0.0] if args.mode == "backlog" else args.rate:
            for name, factory in systems(args):
                print(f"{name} (round {round_}):", file=sys.stderr, flush=True)
                results.append(run_one(factory, rate, args) | {"round": round_})
    print_ratios(results)
    print_targets(fault_targets(results))


if __name__ == "__main__":
    main()
