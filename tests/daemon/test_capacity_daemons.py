"""Two daemons share one store and its limits: never more jobs alive than a limit allows.

Each limit a claim checks is raced: the `jobs` pool (`job_concurrency`, shell jobs), a named
pool (`[pools.racers]`, a wire executor program, `_held_pool_program.py`) and a scope limit
(`[scopes.team]`, shell jobs submitted in that scope). Measured from the jobs themselves: each
job appends "<id> start" when it begins and "<id> end" just before it ends, to one file shared by
both daemons' jobs. Appends land in the order they happen, so walking the file counts exactly
how many jobs were between their start and end at each moment, and a job is alive through that
whole span (it lies inside its attempt's live window). Each run submits its jobs in one batch
to one daemon, which wakes the other, so both claim at once; once the limit is full and both
are refused the rest, the jobs are released one at a time, and each end frees a slot both
daemons claim for at once again.

The daemons ask no start gate (``CONDUIT_TEST_PLUGIN_GATES=selected``: the test plugin's gates
then select no Work, as on a store without gates), so a claim is one transaction that counts,
claims and commits. With a gate to ask, a claim takes two (``admit_ready`` returns the Work to ask
about; ``admit_attempts`` counts again and claims once the gates answered), and one daemon's
second transaction often commits before the other's counts: the lock control then saw the limit
exceeded in only 7 to 17 runs of 20. The positive test runs the gated claim too (``jobs``).

Negative controls run the same with one protection switched off (`CONDUIT_TEST_UNSAFE`,
inherited by both daemons): `capacity_check` (no capacity refusal at all), and on PostgreSQL
`capacity_lock` alone (the claims still count, but no longer wait for each other's count);
for the latter each claim waits a moment between its count and its commit
(`CONDUIT_TEST_FAULT=store.capacity_counted:sleep=…`), so the two daemons' claims overlap as
they could in production, only more often. Each control must see the limit exceeded in 2 of 3
runs at least; the lock control between daemons in 1 of 3 (it detects in 19 of 20 runs).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from conduit_core.http import BatchSubmitRequest, BatchSubmitResult, SubmitRequest
from tests.daemon.conftest import Daemon, wait_for

PROGRAM = Path(__file__).with_name("_held_pool_program.py")
K, N = 2, 3  # a negative control passes when it saw the limit exceeded in K of N runs
#: Jobs past the limit in each control run: each one's start is a slot freed and claimed by both
#: daemons at once, one more chance per run to see an unprotected claim exceed the limit (with 3
#: the lock control saw it in 15 to 18 runs of 20 for the pool and scope limits).
CONTROL_EXTRA = 8
#: Each claim waits between its count and its commit: the window the capacity lock closes.
WIDENED = {"CONDUIT_TEST_FAULT": "store.capacity_counted:sleep=0.3"}
#: The daemons' claims are one transaction each: no start gate is asked (see above).
UNGATED = {"CONDUIT_TEST_PLUGIN_GATES": "selected"}


@dataclass(frozen=True)
class Limit:
    binding: str
    limit: int
    jobs: int
    scope: str | None = None
    #: Where /v1/capacity reports the Work waiting for this limit: ("pools" | "scopes", name).
    waiting_in: tuple[str, str] = ("pools", "jobs")


LIMITS = {
    "jobs": Limit("held", 4, 10),  # job_concurrency in tests/daemon/conftest.py's config
    "pool": Limit("held-pool", 2, 6, waiting_in=("pools", "racers")),
    "scope": Limit("held", 2, 6, scope="team", waiting_in=("scopes", "team")),  # limits.concurrency
}


def _pool_config(root: Path) -> str:
    return f"""
[pools.racers]
concurrency = 2

[executors.held-pool]
command = ["{sys.executable}", "{PROGRAM}", "{root / 'side-effects.log'}", "{root}"]

[bindings.held-pool]
executor = "held-pool"
"""


def _peak_alive(daemon: Daemon, ids: list[str]) -> int:
    alive = peak = 0
    for line in daemon.side.read_text().splitlines():
        work_id, word = line.split()[:2]
        if work_id in ids:
            alive += 1 if word == "start" else -1 if word == "end" else 0
            peak = max(peak, alive)
    return peak


def _waiting(daemon: Daemon, limit: Limit) -> int:
    status, view = daemon.raw("GET", "/v1/capacity")
    assert status == 200, view
    kind, name = limit.waiting_in
    return next(int(p["waiting"]) for p in view[kind] if p["name"] == name)


def _start_pair(
    root: Path,
    store: str,
    daemons: list[Daemon],
    env: dict[str, str] | None = None,
    *,
    gated: bool = False,
) -> tuple[Daemon, Daemon]:
    env = {**(env or {}), **({} if gated else UNGATED)}
    for name in ("d1", "d2"):
        daemons.append(Daemon(root, store, name=name, extra=_pool_config(root)))
    return daemons[-2].start(rescan=0.2, env=env), daemons[-1].start(rescan=0.2, env=env)


def _run_held_jobs(pair: tuple[Daemon, Daemon], limit: Limit, run: int = 0, jobs: int = 0) -> int:
    """Submit held jobs in one batch to one of two daemons (both claim them); once no further
    job can start, release them one at a time (each end frees a slot both daemons claim for)
    and wait for their Work to complete. The most jobs of this run alive at once."""
    first = pair[0]
    jobs = jobs or limit.jobs
    ids = [f"r{run}-j{i:02d}" for i in range(jobs)]
    # One batch: the daemon that takes it wakes the other (at once on PostgreSQL, at its next
    # rescan on SQLite), so both claim from the same ready Work at about the same moment.
    items = [SubmitRequest(binding=limit.binding, id=i, scope=limit.scope) for i in ids]
    done = pair[run % 2].api().request(
        "POST", "/v1/work/batch", BatchSubmitRequest(items=items), BatchSubmitResult
    )
    assert done.created == jobs, done

    def started() -> int:
        return sum(first.runs(work_id, "start") for work_id in ids)

    def settled() -> bool:
        # Past the limit already, or both daemons' last claim pass refused every job not
        # running for capacity: nothing else would start before a release.
        n = started()
        return n > limit.limit or (
            n == limit.limit and all(_waiting(d, limit) == jobs - n for d in pair)
        )

    wait_for("the limit to fill and both daemons to be refused the rest", settled, 60)
    # Then free one slot at a time: each end wakes both daemons, which claim at once for it.
    released: set[str] = set()
    while len(released) < jobs:
        running = [i for i in ids if i not in released and first.runs(i, "start")]
        if not running:
            wait_for("a job to start", lambda: any(
                i not in released and first.runs(i, "start") for i in ids), 60)  # fmt: skip
            continue
        job = running[0]
        first.release(job)
        released.add(job)
        wait_for(f"{job} to end", partial(first.runs, job, "end"), 60)
    for work_id in ids:
        first.wait_status(work_id, "completed", timeout=60)
        assert first.runs(work_id, "start") == 1, f"{work_id} started twice"
    return _peak_alive(first, ids)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "gated"), [*((kind, False) for kind in LIMITS), ("jobs", True)],
    ids=[*LIMITS, "jobs-gated"],
)  # fmt: skip
def test_two_daemons_never_run_more_jobs_than_a_limit(
    tmp_path: Path, store: str, daemons: list[Daemon], kind: str, gated: bool
) -> None:
    """With every protection on; on PostgreSQL even with each claim's window widened as in the
    lock's own negative control (SQLite has one writer: nothing to widen). ``gated``: each
    claim asks the start gates, in two transactions."""
    limit, env = LIMITS[kind], WIDENED if "://" in store else None
    peak = _run_held_jobs(_start_pair(tmp_path, store, daemons, env, gated=gated), limit)
    assert peak <= limit.limit, f"{peak} jobs alive at once, the {kind} limit is {limit.limit}"
    assert peak == limit.limit, f"the limit was never full (peak {peak}): the test proved nothing"


def _k_of_n(pair: tuple[Daemon, Daemon], limit: Limit, k: int = K) -> list[int]:
    """Up to N runs' peaks (a few jobs past the limit each), stopping once the verdict (k of N
    over the limit, or not) is known."""
    peaks: list[int] = []
    while len(peaks) < N:
        seen = sum(p > limit.limit for p in peaks)
        if seen >= k or seen + N - len(peaks) < k:
            break
        peaks.append(
            _run_held_jobs(pair, limit, run=len(peaks), jobs=limit.limit + CONTROL_EXTRA)
        )
    return peaks


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(LIMITS))
def test_negative_control_without_the_capacity_check_the_limit_is_exceeded(
    tmp_path: Path, daemons: list[Daemon], kind: str
) -> None:
    """On SQLite: the switch acts in the claim's count, the same code on both stores."""
    env = {"CONDUIT_TEST_UNSAFE": "capacity_check"}
    pair = _start_pair(tmp_path, str(tmp_path / "conduit.db"), daemons, env)
    peaks = _k_of_n(pair, LIMITS[kind])
    seen = sum(p > LIMITS[kind].limit for p in peaks)
    assert seen >= K, f"peaks {peaks}: the measurement cannot see an exceeded {kind} limit"


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(LIMITS))
def test_negative_control_without_the_capacity_lock_two_daemons_exceed_the_limit(
    tmp_path: Path, postgres_url: str, daemons: list[Daemon], kind: str
) -> None:
    """On PostgreSQL (SQLite has one writer by nature: nothing to lock)."""
    # This control sees the violation in 19 of 20 runs (bench/race_controls.py --daemons), the
    # others in 20: 1 of 3 keeps CI's false alarm near 1 in 10,000 per kind while a lock that
    # protected nothing would still be caught.
    env = {"CONDUIT_TEST_UNSAFE": "capacity_lock", **WIDENED}
    peaks = _k_of_n(_start_pair(tmp_path, postgres_url, daemons, env), LIMITS[kind], k=1)
    seen = sum(p > LIMITS[kind].limit for p in peaks)
    assert seen >= 1, f"peaks {peaks}: two daemons kept the {kind} limit without its lock"
