"""Shell Work beside a misbehaving executor program, through the daemon a user runs.

    .venv/bin/python bench/bench_hostile.py                      # both stores, ~3 min
    .venv/bin/python bench/bench_hostile.py --rounds 3           # interleaved, pooled, ~9 min
    .venv/bin/python bench/bench_hostile.py --store sqlite --seconds 20 --rate 10

For each store, one fresh ``conduit daemon`` per scenario: shell Work submitted at ``--rate`` per
second for ``--seconds``, alone and then beside each hostile program of
tests/daemon/_hostile_program.py (written from docs/wire-protocol.md alone):

- ``hang_stop``: a Work of the program is cancelled at the start; its ``stop`` is never answered,
  so the daemon asks again (2 s request timeout, program restarts) all through the run;
- ``fail_handshake``: the program passed the probe at load and dies before its handshake whenever
  it is started to serve; one of its Work is submitted every second;
- ``flood``: each of its Work sends 100,000 ``phase_begin`` callbacks; a new one is submitted as
  soon as the last one ended.

Per store and scenario one JSON line (``--rounds``: the runs interleaved, their waits pooled):
shell Work started, its submit → start p50/p99 in ms to a tenth (from the wall-clock time taken
just before its ``POST /v1/work`` to the one its shell command writes as its first act, ``date
+%s.%N``: the store's own times are whole milliseconds, too coarse for a p99 of 4 ms to be
judged within 20 %), the p99's ratio to the same store's run alone, each round's own p99 (the
alone rounds' spread is how far the machine alone moves a p99), the hostile program's failed
starts and restarts in each round (its supervisor's counts, from ``GET /v1/health``), the
daemon's CPU while the shell Work was submitted (% of one core; the hostile program's own CPU
is not in it), the daemon's resident memory growth (peak over the sampled baseline), shell Work
that ran twice or never. Then a table. The issue's target: p99 within 20 % of alone, memory bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from bench_daemon import FreshDatabase, free_port, launch_daemon, stop_daemon, wait_until

from conduit_core.http import ApiClient, Health, SubmitRequest, WorkDetail

HERE = Path(__file__).resolve().parent
PROGRAM = HERE.parent / "tests" / "daemon" / "_hostile_program.py"
sys.path.insert(0, str(PROGRAM.parent))
from _peak_rss import PeakRss  # type: ignore[import-not-found]  # noqa: E402

SCENARIOS = ("alone", "hang_stop", "fail_handshake", "flood")

CONFIG = """\
[settings]
store = "{store}"
data_dir = "{data}"
concurrency = 8
job_concurrency = 4
lease_seconds = 30
http.listen = "127.0.0.1:{port}"

[executors.hostile]
command = ["{python}", "{program}", "{mode}", "{root}"]
request_timeout_seconds = 2

[bindings.ok]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID run $(date +%s.%N)" >> {side}' }}

[bindings.hostile]
executor = "hostile"
retry_delays_seconds = []
"""


class Run:
    """One daemon on a fresh store, with one hostile program declared."""

    def __init__(self, store: str, mode: str, root: Path) -> None:
        self.root = root
        self.side = root / "side.log"
        self.db = FreshDatabase("conduit_hostile") if store == "postgres" else None
        self.port = free_port()
        self.config = root / "conduit.toml"
        # The alone run declares the program too (in its harmless flood mode, never used): the
        # daemons differ only in what the program does.
        self.config.write_text(CONFIG.format(
            store=self.db.url if self.db else root / "conduit.db", data=root / "data",
            port=self.port, python=sys.executable, program=PROGRAM,
            mode="flood" if mode == "alone" else mode, root=root, side=self.side,
        ))  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: ApiClient | None = None

    def start(self) -> None:
        self.proc, self.client = launch_daemon(self.root, self.config, self.port, client_timeout=30)

    def submit(self, binding: str) -> str:
        assert self.client is not None
        req = SubmitRequest(binding=binding)
        return self.client.request("POST", "/v1/work", req, WorkDetail).work.id

    def show(self, work_id: str) -> WorkDetail:
        assert self.client is not None
        return self.client.request("GET", f"/v1/work/{work_id}", None, WorkDetail)

    def program_starts(self) -> int:
        """The hostile program's starts that failed or followed its death so far (its
        supervisor's ``failed_starts`` and ``restarts``): each one an interpreter's start-up."""
        assert self.client is not None
        health = self.client.request("GET", "/v1/health", None, Health)
        (program,) = [p for p in health.programs if p.executor == "hostile"]
        return program.failed_starts + program.restarts

    def cancel(self, work_id: str) -> None:
        assert self.client is not None
        self.client.request("POST", f"/v1/work/{work_id}/cancel", {}, dict)

    def stop(self) -> None:
        if self.proc is not None:
            stop_daemon(self.proc, grace=30)
        for proc in psutil.process_iter():  # a shell job or program left behind
            with contextlib.suppress(psutil.Error):
                if str(self.root) in " ".join(proc.cmdline()) or str(self.root) in proc.cwd():
                    proc.kill()
        if self.db is not None:
            self.db.drop()


def hostile_load(run: Run, mode: str, stop: threading.Event) -> threading.Thread | None:
    """The hostile program kept busy until ``stop``, as the module docstring says."""
    if mode == "alone":
        return None
    if mode == "hang_stop":
        work_id = run.submit("hostile")
        wait_until(
            "the hostile Work to run",
            lambda: (d := run.show(work_id)).attempts and d.attempts[-1].status == "running",
            60,
        )
        run.cancel(work_id)  # its stop is asked again and again, never answered
        return None

    def loop() -> None:
        current: str | None = None
        while not stop.is_set():
            if mode == "fail_handshake":
                run.submit("hostile")
                stop.wait(1.0)
                continue
            if current is None or run.show(current).work.status in ("completed", "failed"):
                current = run.submit("hostile")
            stop.wait(0.2)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def percentile(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))], 1)


def measure(store: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_hostile_") as tmp:
        run = Run(store, mode, Path(tmp))
        try:
            run.start()
            assert run.proc is not None
            warm = [run.submit("ok") for _ in range(5)]  # first forks, first plans: not counted
            wait_until("the warm-up", lambda: all(_done(run, w) for w in warm), 60)
            memory = PeakRss(run.proc.pid)
            stop = threading.Event()
            load = hostile_load(run, mode, stop)
            submitted: dict[str, float] = {}

            def submit(binding: str) -> str:
                before = time.time()
                work_id = run.submit(binding)
                submitted[work_id] = before
                return work_id

            daemon = psutil.Process(run.proc.pid)
            cpu_before, began = _cpu_seconds(daemon), time.monotonic()
            works = produce(submit, args.rate, args.seconds)
            cpu_share = (_cpu_seconds(daemon) - cpu_before) / (time.monotonic() - began)
            stop.set()
            program_starts = run.program_starts()
            if load is not None:
                load.join(30)
            wait_until("the shell Work to end", lambda: all(_done(run, w) for w in works), 120)
            grew = round(memory.stop() / 2**20, 1)
            lines = run.side.read_text().splitlines() if run.side.exists() else []
            starts: dict[str, list[float]] = {}
            for line in lines:  # "<work id> run <seconds since the epoch>"
                work_id, _, at = line.split()
                starts.setdefault(work_id, []).append(float(at))
            waits = [
                (min(starts[w]) - submitted[w]) * 1000 for w in works if w in starts
            ]  # fmt: skip
            never = sum(1 for w in works if w not in starts)
            twice = sum(1 for w in works if len(starts.get(w, ())) > 1)
            return {
                "store": store, "scenario": mode, "waits": waits, "rss_grew_mib": grew,
                "ran_twice": twice, "never_started": never, "program_starts": program_starts,
                "daemon_cpu_pct": round(cpu_share * 100, 1),
            }  # fmt: skip
        finally:
            run.stop()


def summary(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """One store and scenario over its rounds: the waits pooled, the worst of the rest."""
    waits = [w for r in runs for w in r["waits"]]
    return {
        "store": runs[0]["store"], "scenario": runs[0]["scenario"], "rate": args.rate,
        "seconds": args.seconds, "rounds": len(runs), "shell_started": len(waits),
        "start_p50_ms": percentile(waits, 50), "start_p99_ms": percentile(waits, 99),
        "start_max_ms": round(max(waits), 1) if waits else None,
        # Each round's own p99: the alone rounds' spread is how far the machine alone moves it.
        "start_p99_by_round_ms": [percentile(r["waits"], 99) for r in runs],
        "rss_grew_mib": max(r["rss_grew_mib"] for r in runs),
        # How often the daemon started the hostile program during each round's shell Work.
        "program_starts_by_round": [r["program_starts"] for r in runs],
        # The daemon's CPU while the shell Work was submitted, in % of one core (mean of rounds).
        "daemon_cpu_pct": round(sum(r["daemon_cpu_pct"] for r in runs) / len(runs), 1),
        "ran_twice": sum(r["ran_twice"] for r in runs),
        "never_started": sum(r["never_started"] for r in runs),
        "load_average": round(os.getloadavg()[0], 1),
    }  # fmt: skip


def _cpu_seconds(process: psutil.Process) -> float:
    """The process's CPU time so far, user and system, its threads included."""
    times = process.cpu_times()
    return float(times.user + times.system)


def _done(run: Run, work_id: str) -> bool:
    return str(run.show(work_id).work.status) in ("completed", "failed")


def produce(submit: Callable[[str], str], rate: float, seconds: float) -> list[str]:
    """Shell Work at ``rate`` per second, credited on wall-clock time."""
    works: list[str] = []
    began = time.monotonic()
    while (elapsed := time.monotonic() - began) < seconds:
        while len(works) < elapsed * rate:
            works.append(submit("ok"))
        time.sleep(min(0.02, 1 / rate))
    return works


def table(results: list[dict[str, Any]]) -> None:
    print("\n| store | scenario | shell Work | start p50 / p99 ms | p99 / alone | p99 by round ms "
          "| program (re)starts by round | daemon CPU % | memory grew MiB | ran twice "
          "| never started |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    alone = {r["store"]: r["start_p99_ms"] for r in results if r["scenario"] == "alone"}
    for r in results:
        base = alone.get(r["store"])
        ratio = f"{r['start_p99_ms'] / base:.2f}" if base and r["start_p99_ms"] else "-"
        by_round = ", ".join(str(p) for p in r["start_p99_by_round_ms"])
        starts = ", ".join(str(n) for n in r["program_starts_by_round"])
        print(f"| {r['store']} | {r['scenario']} | {r['shell_started']} | {r['start_p50_ms']} / "
              f"{r['start_p99_ms']} | {ratio} | {by_round} | {starts} | {r['daemon_cpu_pct']} | "
              f"{r['rss_grew_mib']} | "
              f"{r['ran_twice']} | {r['never_started']} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--store", nargs="+", choices=["sqlite", "postgres"],
                        default=["sqlite", "postgres"])  # fmt: skip
    parser.add_argument("--scenario", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--rate", type=float, default=10.0, help="shell Work per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat every scenario, interleaved; waits pooled")  # fmt: skip
    args = parser.parse_args()
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for round_no in range(1, args.rounds + 1):
        for store in args.store:
            for mode in args.scenario:
                print(f"round {round_no}: {store} {mode} ...", file=sys.stderr, flush=True)
                runs.setdefault((store, mode), []).append(measure(store, mode, args))
    results = [summary(done, args) for done in runs.values()]
    for result in results:
        print(json.dumps(result), flush=True)
    table(results)


if __name__ == "__main__":
    main()
