"""How often each race detector fails, with and without each protection.

Runs tests/storage/test_race.py's races ``--runs`` times per configuration, each on a fresh
store, and prints in how many runs the detector saw a violation:

- ``global``, ``pool``, ``scope``: four racer processes claim ready Work at once against a limit
  of 3 (the global limit, a named pool, a scope limit reached as an ancestor), each holding what
  it got until every racer has claimed; a violation is more than 3 attempts live at once.
- ``work``: four racers each claim a Work picked at random of three; a violation is two attempts
  of one Work live at once (for the control, the store's one-live index is dropped too).

With ``--daemons``, instead: tests/daemon/test_capacity_daemons.py's race between two real
daemons on PostgreSQL (held jobs, half submitted to each in one batch; a violation is more jobs
alive at once than the limit, read from the jobs' own start/end lines), per limit (``jobs``,
``pool``, ``scope``), with every protection on and with ``capacity_lock`` off, each claim's window
widened in both (``CONDUIT_TEST_FAULT=store.capacity_counted:sleep=0.3``), no start gate asked
(each claim one transaction, as the test runs them); one daemon pair per configuration,
``--runs`` runs on it.

With ``--keys``: tests/daemon/test_key_daemons.py's race between two real daemons on
PostgreSQL (24 short shell jobs over 3 concurrency keys of limit 2, interleaved in one batch; a
violation is more jobs of one key alive at once than its limit, read from the jobs' own
start/end lines), with every protection on and with ``key_check`` off; one daemon pair per
configuration, ``--runs`` runs on it.

With every protection on the count must be 0; with one switched off (``CONDUIT_TEST_UNSAFE``,
see conduit_core/extension/_switches.py) the target is at least 19 of 20. The switch works only
where the test-only plugin is installed (the test venv; elsewhere the store refuses to open with
it set), so run it with the test venv's Python:

    .venv/bin/python bench/race_controls.py --runs 20 [--daemons | --keys]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import psycopg

from conduit_core.storage import open_store
from conduit_core.storage._race import (
    LIMIT_KINDS,
    drop_one_live_index,
    max_overlap,
    overlaps,
    race_scope,
    run_race,
)
from conduit_core.storage.conformance import make_input, make_work

PG_URL = os.environ.get(
    "CONDUIT_TEST_PG_URL", "postgresql://root@/postgres?host=/var/run/postgresql"
)
LIMIT = 3
WORK = [f"w{i}" for i in range(3)]


@contextmanager
def fresh_store(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite://{tmp}/race.db"
        return
    name = f"conduit_race_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urlunsplit(urlsplit(PG_URL)._replace(path=f"/{name}"))
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _create(url: str, work_ids: list[str], kind: str) -> None:
    async def create() -> None:
        store = await open_store(url)
        try:
            for n, work_id in enumerate(work_ids):
                work = make_work(work_id, scope=race_scope(kind, n))
                await store.create_work(work, first_input=make_input(work_id))
        finally:
            await store.aclose()

    anyio.run(create)


def one_run(backend: str, race: str, switch: str, rounds: int) -> tuple[bool, int]:
    """Whether the detector saw a violation in one race on a fresh store, and its measure
    (the peak live at once, or the number of overlapping attempt pairs)."""
    with fresh_store(backend) as url:
        if race == "work":
            _create(url, WORK, "global")
            if switch:
                drop_one_live_index(url)
            windows = run_race(url, WORK, mode="pick", processes=4, rounds=rounds)
            found = len(overlaps(windows))
            return found > 0, found
        _create(url, [f"w{i}" for i in range(6)], race)
        windows = run_race(
            url, [], mode="ready", processes=4, rounds=rounds, limit=LIMIT, kind=race
        )
        peak = max_overlap(windows)
        return peak > LIMIT, peak


def configurations(backends: list[str]) -> Iterator[tuple[str, str, str]]:
    for backend in backends:
        for race in LIMIT_KINDS:
            switches = ["", "capacity_check"] + (["capacity_lock"] if backend == "postgres" else [])
            for switch in switches:
                yield backend, race, switch
        for switch in ("", "work_exclusion"):
            yield backend, "work", switch


def daemon_runs(race: str, switch: str, runs: int) -> list[int]:
    """The peak of each of ``runs`` two-daemon races on one daemon pair (PostgreSQL)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's tests package
    from tests.daemon.test_capacity_daemons import (
        LIMITS,
        WIDENED,
        _control_run,
        _start_pair,
    )

    env = {**WIDENED, **({"CONDUIT_TEST_UNSAFE": switch} if switch else {})}
    limit = LIMITS[race]
    with tempfile.TemporaryDirectory() as tmp, fresh_store("postgres") as url:
        daemons: list[Any] = []
        try:
            pair = _start_pair(Path(tmp), url, daemons, env)
            return [_control_run(pair, limit, n) for n in range(runs)]
        finally:
            for daemon in daemons:
                daemon.kill()


def main_daemons(args: argparse.Namespace) -> None:
    for race in ("jobs", "pool", "scope"):
        for switch in ("", "capacity_lock"):
            if args.race is not None and race not in args.race:
                continue
            if args.switch is not None and (switch or "-") not in args.switch:
                continue
            started = time.monotonic()
            peaks = daemon_runs(race, switch, args.runs)
            limit = 4 if race == "jobs" else 2
            print(
                f"daemons  {race:6} off={switch or '-':15} detector failed in "
                f"{sum(p > limit for p in peaks):2}/{args.runs} runs (limit {limit}, peaks "
                f"{sorted(set(peaks))}, {time.monotonic() - started:.0f} s)",
                flush=True,
            )


def key_runs(switch: str, runs: int) -> list[int]:
    """The highest per-key peak of each of ``runs`` two-daemon key races (PostgreSQL)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's tests package
    from tests.daemon.test_key_daemons import run_keyed_jobs, start_daemons

    env = {"CONDUIT_TEST_UNSAFE": switch} if switch else None
    with tempfile.TemporaryDirectory() as tmp, fresh_store("postgres") as url:
        daemons: list[Any] = []
        try:
            started = start_daemons(Path(tmp), url, daemons, env)
            return [max(run_keyed_jobs(started, run=n).values()) for n in range(runs)]
        finally:
            for daemon in daemons:
                daemon.kill()


def main_keys(args: argparse.Namespace) -> None:
    from tests.daemon.test_key_daemons import KEY_LIMIT

    for switch in ("", "key_check"):
        if args.switch is not None and (switch or "-") not in args.switch:
            continue
        started = time.monotonic()
        peaks = key_runs(switch, args.runs)
        print(
            f"keys     off={switch or '-':15} detector failed in "
            f"{sum(p > KEY_LIMIT for p in peaks):2}/{args.runs} runs (key_limit {KEY_LIMIT}, "
            f"peaks {sorted(set(peaks))}, {time.monotonic() - started:.0f} s)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10, help="rounds per race (as the test)")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], nargs="*",
                        default=["sqlite", "postgres"])  # fmt: skip
    parser.add_argument("--race", choices=[*LIMIT_KINDS, "work", "jobs"], nargs="*", default=None,
                        help="only these races (default: all)")  # fmt: skip
    parser.add_argument("--switch", nargs="*", default=None,
                        help="only these configurations ('-' = every protection on)")  # fmt: skip
    parser.add_argument("--daemons", action="store_true",
                        help="race two daemons (PostgreSQL), not racer processes")  # fmt: skip
    parser.add_argument("--keys", action="store_true",
                        help="race two daemons on concurrency keys (PostgreSQL)")  # fmt: skip
    args = parser.parse_args()
    if args.keys:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        main_keys(args)
        return
    if args.daemons:
        main_daemons(args)
        return
    keep: Callable[[str, str], bool] = lambda race, switch: (  # noqa: E731
        (args.race is None or race in args.race)
        and (args.switch is None or (switch or "-") in args.switch)
    )
    for backend, race, switch in configurations(args.backend):
        if not keep(race, switch):
            continue
        os.environ["CONDUIT_TEST_UNSAFE"] = switch  # inherited by the spawned racers only
        started = time.monotonic()
        outcomes = [one_run(backend, race, switch, args.rounds) for _ in range(args.runs)]
        failed = sum(seen for seen, _ in outcomes)
        measure = "overlaps" if race == "work" else "peaks"
        print(
            f"{backend:8} {race:6} off={switch or '-':15} detector failed in "
            f"{failed:2}/{args.runs} runs ({measure} {sorted({m for _, m in outcomes})}, "
            f"{time.monotonic() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
