"""How often the capacity race detector fails, with and without each protection.

Runs tests/storage/test_race.py's race (four racer processes claim ready Work at once against a
limit of 3, each holding what it got until every racer has claimed) ``--runs`` times per
configuration, each on a fresh store, and prints in how many runs the detector saw more than 3
attempts live at once. With every protection on that must be 0; with one switched off
(``CONDUIT_TEST_UNSAFE``, see conduit_core/extension/_switches.py) the target is at least 19 of 20.
The switch works only where the test-only plugin is installed (the test venv; elsewhere the store
refuses to open with it set), so run it with the test venv's Python:

    .venv-test/bin/python bench/race_controls.py --runs 20
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import anyio
import psycopg

from conduit_core.storage import open_store
from conduit_core.storage._race import max_overlap, run_race
from conduit_core.storage.conformance import make_input, make_work

PG_URL = os.environ.get(
    "CONDUIT_TEST_PG_URL", "postgresql://root@/postgres?host=/var/run/postgresql"
)
LIMIT = 3


def one_run(backend: str, rounds: int) -> int:
    """The peak number of attempts live at once in one race on a fresh store."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            return _race(f"sqlite://{tmp}/race.db", rounds)
    name = f"conduit_race_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            return _race(urlunsplit(urlsplit(PG_URL)._replace(path=f"/{name}")), rounds)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _race(url: str, rounds: int) -> int:
    async def create() -> None:
        store = await open_store(url)
        try:
            for i in range(6):
                await store.create_work(make_work(f"w{i}"), first_input=make_input(f"w{i}"))
        finally:
            await store.aclose()

    anyio.run(create)
    windows = run_race(url, [], mode="ready", processes=4, rounds=rounds, limit=LIMIT)
    return max_overlap(windows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10, help="rounds per race (as the test)")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], nargs="*",
                        default=["sqlite", "postgres"])  # fmt: skip
    parser.add_argument("--switch", nargs="*", default=None,
                        help="only these configurations ('-' = every protection on)")  # fmt: skip
    args = parser.parse_args()
    configs = [("sqlite", ""), ("sqlite", "capacity_check")]
    configs += [("postgres", ""), ("postgres", "capacity_check"), ("postgres", "capacity_lock")]
    for backend, switch in configs:
        if backend not in args.backend:
            continue
        if args.switch is not None and (switch or "-") not in args.switch:
            continue
        os.environ["CONDUIT_TEST_UNSAFE"] = switch  # inherited by the spawned racers only
        started = time.monotonic()
        peaks = [one_run(backend, args.rounds) for _ in range(args.runs)]
        failed = sum(p > LIMIT for p in peaks)
        print(
            f"{backend:8} off={switch or '-':15} detector failed in {failed:2}/{args.runs} runs "
            f"(peaks {sorted(set(peaks))}, {time.monotonic() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
