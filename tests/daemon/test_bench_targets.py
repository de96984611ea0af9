"""``bench/bench_daemon.py`` judges issue 32's targets from its results (``_daemon_targets.py``):
the verdicts must follow the figures, a missing figure must say "not measured" rather than pass,
and the time back at rate after a fault must come from the jobs' starts."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

TARGETS = Path(__file__).resolve().parents[2] / "bench" / "_daemon_targets.py"


def _targets() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_daemon_targets", TARGETS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_daemon_targets"] = module
    spec.loader.exec_module(module)
    return module


def _summary(peer: str, store: str, rate: float | None, p99: float | None) -> dict[str, Any]:
    return {
        "peer": peer,
        "store": store,
        "find_max": True,
        "max_sustained_per_s": rate,
        "p99_ms_at_max": p99,
    }


def _run(
    peer: str, store: str, rate: float, p99: float, dead: float | None, finished: float = 0.0
) -> dict[str, Any]:
    run = {
        "peer": peer,
        "store": store,
        "offered_per_s": rate,
        "finished_per_s": finished or rate,
        "p99_ms": p99,
    }
    return run | ({"dead_made_per_job": dead} if dead is not None else {})


def _verdicts(rows: list[dict[str, Any]]) -> dict[str, bool | None]:
    return {row["target"]: row["met"] for row in rows}


def test_find_max_ratios_p99_and_dead_rows_are_judged_against_procrastinate() -> None:
    t = _targets()
    summaries = [
        _summary("conduit", "sqlite", 915, 230.5),
        _summary("conduit", "postgres", 750, 60.0),
        _summary("procrastinate", "postgres", 375, 124.8),
    ]
    runs = [
        _run("conduit", "sqlite", 469, 20.0, None),  # the lowest sustained rate ≥ 375 judges
        _run("conduit", "sqlite", 586, 200.0, None),
        _run("conduit", "sqlite", 300, 300.0, None),
        _run("conduit", "postgres", 375, 130.0, 5.0),
        _run("conduit", "postgres", 750, 60.0, 5.0),
        _run("procrastinate", "postgres", 375, 124.8, 1.9),
    ]
    verdicts = _verdicts(t.find_max_targets(summaries, runs))
    assert verdicts == {
        "conduit sqlite highest sustained ≥ 3x Procrastinate's": False,  # 915 < 1,125
        "conduit sqlite p99 at Procrastinate's highest rate (375/s) ≤ its p99": True,
        "conduit postgres highest sustained ≥ 2x Procrastinate's": True,  # 750 = 2 x 375
        "conduit postgres p99 at Procrastinate's highest rate (375/s) ≤ its p99": False,
        "dead rows made per finished job ≤ Procrastinate's (worst run)": False,
    }


def test_a_rate_conduit_cannot_sustain_fails_and_one_it_never_ran_is_not_measured() -> None:
    t = _targets()
    summaries = [
        _summary("conduit", "postgres", 300, 50.0),
        _summary("procrastinate", "postgres", 469, 100.0),
    ]
    # conduit ran at 586 but did not sustain it (500 finished): no p99 to compare there.
    runs = [
        _run("conduit", "postgres", 300, 50.0, None),
        _run("conduit", "postgres", 586, 9.0, None, 500),
    ]
    target = "conduit postgres p99 at Procrastinate's highest rate (469/s) ≤ its p99"
    # conduit sustains only 300/s: at 469 its queue grows, so its waits there have no bound.
    assert _verdicts(t.find_max_targets(summaries, runs))[target] is False
    summaries[0]["max_sustained_per_s"] = 500  # sustained in a run the list does not hold
    assert _verdicts(t.find_max_targets(summaries, runs))[target] is None
    assert t.find_max_targets(summaries[:1], runs) == []  # no peer: nothing judged


def test_backlog_drain_is_judged_against_each_systems_own_highest_rate() -> None:
    t = _targets()
    summaries = [
        _summary("conduit", "postgres", 400, 1.0),
        _summary("conduit", "sqlite", None, None),
    ]
    backlogs = [
        {"peer": "conduit", "store": "postgres", "finished_per_s": 365.0},
        {"peer": "conduit", "store": "postgres", "finished_per_s": 355.0},
        {"peer": "conduit", "store": "sqlite", "finished_per_s": 900.0},
    ]
    rows = t.backlog_targets(summaries, backlogs)
    assert [row["met"] for row in rows] == [True, False, None]  # 0.9125, 0.8875, no rate


def test_back_at_rate_is_the_first_whole_second_at_rate_after_each_fault() -> None:
    t = _targets()
    rate = 100.0
    # 100 starts a second from 1000 to 1010, none in [1010, 1013), 40 in 1013, then 100 again.
    starts = [s + i / 100 for s in range(1000, 1010) for i in range(100)]
    starts += [1013 + i / 40 for i in range(40)]
    starts += [s + i / 100 for s in range(1014, 1030) for i in range(100)]
    assert t.back_at_rate_after(starts, [1010.0], rate) == 5.0  # the second 1014 → 1015
    assert t.back_at_rate_after(starts, [1002.5], rate) == 1.5  # the second 1003 → 1004
    assert t.back_at_rate_after(starts, [1002.5, 1010.0], rate) == 5.0  # the worst fault
    assert t.back_at_rate_after(starts, [1030.0], rate) is None  # never back
    assert t.back_at_rate_after(starts, [], rate) == 0.0


def test_faults_judge_time_back_lost_and_run_twice() -> None:
    t = _targets()
    ok = {
        "peer": "conduit",
        "store": "sqlite",
        "mode": "kill",
        "back_at_rate_after_s": 4.0,
        "lost": 0,
        "ran_twice": 0,
        "submitted": 6000,
    }
    slow = ok | {"store": "postgres", "back_at_rate_after_s": 12.0, "ran_twice": 1}
    undecided = ok | {"mode": "pg-down", "back_at_rate_after_s": None, "lost": None}
    rows = t.fault_targets([ok, slow, undecided, ok | {"peer": "procrastinate"}])
    assert [row["met"] for row in rows] == [True, True, False, False, False, None]


def test_the_highest_sustained_rate_steps_by_quarters_then_halves_the_last_step() -> None:
    t = _targets()

    def capacity(limit: float) -> tuple[list[float], Callable[[float], bool]]:
        tried: list[float] = []

        def sustains(rate: float) -> bool:
            tried.append(rate)
            return rate <= limit

        return tried, sustains

    tried, sustains = capacity(430)
    assert t.highest_sustained(300, sustains) == 375
    assert tried == [300, 375, 469]
    tried, sustains = capacity(430)
    assert t.highest_sustained(300, sustains, refine=2) == 422
    assert tried == [300, 375, 469, 422, 446]  # 422 sustained, 446 not
    tried, sustains = capacity(220)
    assert t.highest_sustained(300, sustains, refine=1) == 216  # down by fifths, then halved
    assert tried == [300, 240, 192, 216]
    tried, sustains = capacity(5)
    assert t.highest_sustained(10, sustains, refine=2) is None  # never sustained down to 8
    assert tried == [10, 8]


def test_each_conduit_store_is_run_at_procrastinates_highest_rate_where_its_steps_missed_it(
    monkeypatch: Any,
) -> None:
    """The p99 target compares the systems at one load: a conduit store whose find-max steps
    did not land on Procrastinate's highest sustained rate runs once more at exactly it."""
    monkeypatch.syspath_prepend(str(TARGETS.parent))
    spec = importlib.util.spec_from_file_location("bench_daemon", TARGETS.parent / "bench_daemon.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ran: list[tuple[str, float, str]] = []

    def run_one(factory: Callable[[Path], Any], rate: float, args: Any) -> dict[str, Any]:
        ran.append((factory(Path("/nowhere")), rate, args.mode))
        return {"peer": "conduit", "offered_per_s": rate}

    monkeypatch.setattr(module, "run_one", run_one)
    monkeypatch.setattr(module, "ConduitSystem", lambda store, root, args: store)
    args = module.argparse.Namespace(store=["sqlite", "postgres"], peer_python="py",
                                     mode="backlog")  # fmt: skip
    summaries = [_summary("procrastinate", "postgres", 338, 124.8)]
    runs = [_run("conduit", "sqlite", 338, 20.0, None), _run("conduit", "postgres", 375, 9.0, 4.0)]
    added = module.at_peer_rate(summaries, runs, args)
    assert ran == [("postgres", 338, "steady")]  # SQLite had a step at 338 already
    assert added == [{"peer": "conduit", "offered_per_s": 338}]
    ran.clear()
    nothing_sustained = [_summary("procrastinate", "postgres", None, None)]
    assert module.at_peer_rate(nothing_sustained, runs, args) == []
    assert ran == []  # Procrastinate sustained nothing: no rate to compare at
