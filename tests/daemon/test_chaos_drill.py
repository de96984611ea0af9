"""The chaos drill (bench/chaos_drill.py), bounded: real daemons SIGKILLed at random moments, for
each executor kind (shell on both stores, the container executor, a wire program on PostgreSQL)
and for two daemons on one PostgreSQL store; and its checker shown able to fail.

Each drill must show its kills did something: some landed mid-launch (read from the store after
the kill), and attempts were recovered and relaunched; with 0 duplicates, 0 overlaps, 0 burnt
retries and nothing left behind (processes, programs, containers).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests._ci import unavailable
from tests.storage.conftest import postgres_url, sqlite_url  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[2]
DRILL = REPO_ROOT / "bench" / "chaos_drill.py"


def _drill_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos_drill", DRILL)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos_drill"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_the_checker_catches_a_duplicate_and_a_burnt_retry() -> None:
    drill = _drill_module()
    one = drill.AttemptFacts(
        attempt=1, completed=True, failure_code=None, relaunched_segments=1, recovered_segments=0
    )
    records = {"i1": drill.ItemRecord(attempts=[one], failure_count=0, retry_pending=False)}
    clean = drill.check(["i1"], records, ["i1 10 1.0"], ["i1 10 1.0 2.0"], [])
    assert clean.violations == []  # a relaunched segment costs nothing

    twice = drill.check(
        ["i1"], records, ["i1 10 1.0", "i1 11 1.5"], ["i1 10 1.0 2.0", "i1 11 1.5 2.5"], []
    )
    assert twice.summary["duplicates"] == 2
    assert twice.summary["overlaps"] == 1
    assert any("started 2 times" in v for v in twice.violations)

    lost = drill.AttemptFacts(
        attempt=1, completed=False, failure_code="not_started", relaunched_segments=0,
        recovered_segments=1,
    )  # fmt: skip
    retried = {"i1": drill.ItemRecord(attempts=[lost, one], failure_count=0, retry_pending=False)}
    burnt = drill.check(["i1"], retried, ["i1 10 1.0"], ["i1 10 1.0 2.0"], ["pid 7 i1#2/1/ab"])
    assert burnt.summary["burnt_retries"] == 1
    assert burnt.summary["orphans"] == 1
    assert len(burnt.violations) == 2


def test_the_checker_fails_kills_that_proved_nothing_about_launches() -> None:
    drill = _drill_module()
    one = drill.AttemptFacts(
        attempt=1, completed=True, failure_code=None, relaunched_segments=1, recovered_segments=1
    )
    records = {"i1": drill.ItemRecord(attempts=[one], failure_count=0, retry_pending=False)}
    args: tuple[object, ...] = (["i1"], records, ["i1 10 1.0"], ["i1 10 1.0 2.0"], [])
    assert drill.check(*args, kills=5, kills_mid_launch=2).violations == []
    missed = drill.check(*args, kills=5, kills_mid_launch=0).violations
    assert missed == [
        "5 kills proved too little: 0 landed mid-launch, 1 segments recovered, 1 relaunched "
        "(each must be > 0)"
    ]


def _docker_ready() -> None:
    import docker

    try:
        client = docker.from_env()
        client.images.get("conduit-test-busybox:latest")
    except docker.errors.DockerException as exc:
        unavailable(f"the container drill needs Docker and the test image: {exc}")
    client.close()


# (executor, store, daemons, items, concurrency): 20 s of kills each, about half of them aimed at
# a launch in flight; the container case has fewer, slower items.
CASES = [
    pytest.param("shell", "sqlite", 1, 120, 8, id="shell-sqlite"),
    pytest.param("shell", "postgres", 1, 120, 8, id="shell-postgres"),
    pytest.param("container", "sqlite", 1, 30, 4, id="container-sqlite"),
    pytest.param("wire", "postgres", 1, 100, 8, id="wire-postgres"),
    pytest.param("shell", "postgres", 2, 120, 8, id="two-daemons-postgres"),
]


@pytest.mark.parametrize(("executor", "store", "daemons", "items", "concurrency"), CASES)
def test_bounded_chaos_drill(
    executor: str, store: str, daemons: int, items: int, concurrency: int,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    if executor == "container":
        _docker_ready()
    url: str = request.getfixturevalue(f"{store}_url")
    done = subprocess.run(
        [sys.executable, str(DRILL), "--executor", executor, "--store", store, "--store-url", url,
         "--daemons", str(daemons), "--items", str(items), "--concurrency", str(concurrency),
         "--seconds", "20", "--min-kills", "5", "--targeted", "0.6", "--job-seconds", "1",
         "--settle-seconds", "120"],
        capture_output=True, text=True, timeout=400, cwd=REPO_ROOT,
    )  # fmt: skip
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, f"{summary}\n{done.stderr[-4000:]}"
    assert summary["kills"] >= 5, summary
    assert summary["started_during_kills"] > 0, "the kills must land while jobs run"
    assert summary["kills_mid_launch"] > 0, summary
    assert summary["recovered_segments"] > 0, summary
    assert summary["relaunched_segments"] > 0, summary
    assert summary["duplicates"] == summary["overlaps"] == 0, summary
    assert summary["burnt_retries"] == 0, summary
    assert summary["orphans"] == 0, summary
    assert summary["attempts"] == summary["items"] == items
