"""Recovery at scale: N running shell jobs, the daemon SIGKILLed, restarted; how soon all are
adopted.

    .venv/bin/python bench/bench_recovery.py                         # both stores, lease 3 and 30
    .venv/bin/python bench/bench_recovery.py --store sqlite --lease 30 --jobs 200   # quick

For each store and ``lease_seconds``: N Work submitted straight into a fresh store, a real
``conduit daemon`` (``concurrency = job_concurrency = N``) runs them as ``sleep`` jobs until all
N are running with their recovery metadata recorded; the daemon is SIGKILLed and a new one
started at once on the same data dir. Printed, from the restart: when the API answers, and when
every attempt is adopted (running again at the next epoch; read from the store every 0.1 s),
and the CPU seconds the restarted daemon used until then. It also checks that every job was
adopted, not relaunched (each ``sleep`` started once). Then the daemon is stopped and the jobs
are killed by their launch marker.

``--profile-seconds S`` runs ``py-spy record`` on the restarted daemon for S seconds and prints
its top frames (``pip install py-spy`` first). Run with another checkout's interpreter (e.g.
``/work/main/.venv/bin/python bench/bench_recovery.py``) for a before/after comparison: the
daemon runs with the interpreter that runs the bench.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import anyio
import psutil
from chaos_drill import (  # type: ignore[import-not-found]
    _free_port,
    drill_processes,
    scratch_store,
    submit_items,
)

from conduit_core.model import ExecutionStatus
from conduit_core.storage import Store, open_store

CONFIG = """\
[settings]
store = "{store}"
data_dir = "{data}"
concurrency = {jobs}
job_concurrency = {jobs}
lease_seconds = {lease}
http.listen = "127.0.0.1:{port}"

[bindings.sleep]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID" >> {root}/starts.log; exec sleep {seconds}' }}
"""


class Run:
    def __init__(self, root: Path, store: str, jobs: int, lease: float, job_seconds: int) -> None:
        self.root = root
        self.store_url = store
        self.jobs = jobs
        self.prefix = f"rec-{uuid.uuid4().hex[:8]}-"
        self.items = [f"{self.prefix}{n:05}" for n in range(jobs)]
        self.port = _free_port()
        self.config = root / "conduit.toml"
        self.config.write_text(
            CONFIG.format(
                store=store, data=root / "data", jobs=jobs, lease=lease, port=self.port,
                root=root, seconds=job_seconds,
            )
        )  # fmt: skip
        self.log = (root / "daemon.log").open("ab")
        self.daemon: subprocess.Popen[bytes] | None = None

    def start_daemon(self) -> None:
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "conduit_core.cli", "daemon", "--config", str(self.config)],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=self.root,
        )  # fmt: skip

    def listening(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    async def states(self, store: Store) -> Counter[str]:
        """``running@<epoch>`` (recovery recorded) or the status, per live attempt."""
        found: Counter[str] = Counter()
        for ex in await store.live_executions():
            if not ex.work_id.startswith(self.prefix):
                continue
            running = ex.status is ExecutionStatus.RUNNING and ex.recovery is not None
            found[f"running@{ex.epoch}" if running else str(ex.status)] += 1
        return found

    async def wait_until(self, store: Store, done: str, seconds: float) -> float | None:
        """The monotonic time at which ``done`` counted every job (polled every 0.1 s);
        ``None`` on timeout."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if (await self.states(store))[done] >= self.jobs:
                return time.monotonic()
            await anyio.sleep(0.1)
        return None


async def measure(args: argparse.Namespace, kind: str, lease: float) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="conduit-bench-recovery-"))
    try:
        with scratch_store(kind, root, "conduit_bench_rec") as url:
            return await _measure(args, kind, root, url, lease)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


async def _measure(
    args: argparse.Namespace, kind: str, root: Path, url: str, lease: float
) -> dict[str, object]:
    run = Run(root, url, args.jobs, lease, args.job_seconds)
    store = await open_store(url)
    profiler: subprocess.Popen[bytes] | None = None
    try:
        await submit_items(store, run.items, "sleep")
        submitted = time.monotonic()
        run.start_daemon()
        launched = await run.wait_until(store, "running@1", args.timeout)
        if launched is None:
            raise SystemExit(f"not all {args.jobs} jobs ran: {dict(await run.states(store))}")
        assert run.daemon is not None
        run.daemon.send_signal(signal.SIGKILL)
        run.daemon.wait()
        restarted = time.monotonic()
        restarted_at = time.time()
        log_offset = run.log.tell()
        run.start_daemon()
        if args.profile_seconds and args.profile_from == "start":
            profiler = _profile(run, args.profile_seconds, root)
        answered = None
        while answered is None and time.monotonic() - restarted < 60:
            if run.listening():
                answered = time.monotonic() - restarted
            else:
                await anyio.sleep(0.02)
        if args.profile_seconds and args.profile_from == "api":  # adoption, not imports
            profiler = _profile(run, args.profile_seconds, root)
        adopted = await run.wait_until(store, "running@2", args.timeout)
        # CPU the restarted daemon spent from its start until all were adopted (startup
        # included): the work done, which a loaded machine stretches in time but not in CPU.
        assert run.daemon is not None
        cpu = psutil.Process(run.daemon.pid).cpu_times()
        starts = Counter((root / "starts.log").read_text().split())
        result: dict[str, object] = {
            "store": kind,
            "lease_seconds": lease,
            "jobs": args.jobs,
            "all_running_s": round(launched - submitted, 1),
            "api_answers_s": None if answered is None else round(answered, 2),
            "all_adopted_s": None if adopted is None else round(adopted - restarted, 2),
            "adopted_after_api_s": (
                None
                if adopted is None or answered is None
                else round(adopted - restarted - answered, 2)
            ),
            "daemon_cpu_s": None if adopted is None else round(cpu.user + cpu.system, 2),
            **_phases(root / "daemon.log", log_offset, restarted_at),
            "started_twice": sum(n > 1 for n in starts.values()),
            "states": dict(await run.states(store)),
        }
        if profiler is not None:
            profiler.wait()
            result["profile"] = _top_frames(root / "profile.txt", args.top)
        return result
    finally:
        await _stop(run, store)
        await store.aclose()


def _phases(log: Path, offset: int, restarted_at: float) -> dict[str, float | None]:
    """Seconds from the restart to the restarted daemon's log lines that mark its phases: its
    predecessor's leases released (start-up done: imports, config, store), the first and the
    last recovery spawned (the claims)."""
    marks: dict[str, float | None] = {
        "took_over_s": None, "first_recovery_s": None, "last_recovery_s": None,
    }  # fmt: skip
    with log.open("rb") as lines:
        lines.seek(offset)
        for raw in lines:
            line = raw.decode(errors="replace")
            if "predecessor owner=" in line:
                key = "took_over_s"
            elif "attempt recover " in line:
                key = "last_recovery_s" if marks["first_recovery_s"] else "first_recovery_s"
            else:
                continue
            try:
                at = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            marks[key] = round(at - restarted_at, 2)
    return marks


def _profile(run: Run, seconds: float, root: Path) -> subprocess.Popen[bytes]:
    """py-spy on the restarted daemon (its threads included), raw stacks for _top_frames."""
    assert run.daemon is not None
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen(
        [py_spy, "record", "--pid", str(run.daemon.pid), "--duration", str(int(seconds)),
         "--format", "raw", "--rate", "200", "--threads", "--output", str(root / "profile.txt")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _top_frames(path: Path, top: int) -> dict[str, object]:
    """Per frame: the share of samples whose stack holds it (inclusive) and ends in it (self)."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines() if path.exists() else []:
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        # Threads idling in the pool or the event loop's selector are not work.
        if not frames or frames[-1].startswith(_IDLE):
            continue
        total += count
        for frame in set(frames):
            inclusive[_short(frame)] += count
        own[_short(frames[-1])] += count
    share = lambda n: round(100 * n / total, 1) if total else 0.0  # noqa: E731
    return {
        "samples": total,
        "self": [(f, share(n)) for f, n in own.most_common(top)],
        "inclusive": [(f, share(n)) for f, n in inclusive.most_common(top * 2)],
    }


_IDLE = ("Condition.wait ", "Queue.get ", "EpollSelector.select ", "select ", "sleep ")


def _short(frame: str) -> str:
    # "function (path/to/module.py:123)" → "function (module.py)"
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.split(':')[0]).name})" if where else name


async def _stop(run: Run, store: Store) -> None:
    if run.daemon is not None and run.daemon.poll() is None:
        run.daemon.send_signal(signal.SIGTERM)
        try:
            run.daemon.wait(120)
        except subprocess.TimeoutExpired:
            run.daemon.kill()
            run.daemon.wait()
    for found in drill_processes(run.prefix):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(found.split()[1]), signal.SIGKILL)


async def main_async(args: argparse.Namespace) -> int:
    worst = 0.0
    for kind in args.store:
        for lease in args.lease:
            result = await measure(args, kind, lease)
            print(json.dumps(result), flush=True)
            adopted = result["all_adopted_s"]
            worst = max(worst, float(adopted) if isinstance(adopted, float) else float("inf"))
    print(json.dumps({"worst_all_adopted_s": worst, "target_s": 5.0, "met": worst <= 5.0}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", nargs="+", choices=("sqlite", "postgres"),
                        default=["sqlite", "postgres"])  # fmt: skip
    parser.add_argument("--lease", nargs="+", type=float, default=[3.0, 30.0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--job-seconds", type=int, default=900)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--profile-seconds", type=float, default=0.0)
    parser.add_argument("--profile-from", choices=("api", "start"), default="api",
                        help="profile from the API's first answer (default) or from the "
                        "restarted daemon's start (its imports and start-up included)")  # fmt: skip
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs)")
    return anyio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
