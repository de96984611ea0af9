"""The chaos drill (bench/chaos_drill.py), bounded: a real daemon SIGKILLed at random moments
while 150 shell items run for 45 s, on each store; and its checker shown able to fail."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

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


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_bounded_chaos_drill(store: str, request: pytest.FixtureRequest) -> None:
    url: str = request.getfixturevalue(f"{store}_url")
    done = subprocess.run(
        [sys.executable, str(DRILL), "--store", store, "--store-url", url, "--items", "150",
         "--seconds", "45", "--job-seconds", "1", "--settle-seconds", "300"],
        capture_output=True, text=True, timeout=600, cwd=REPO_ROOT,
    )  # fmt: skip
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, f"{summary}\n{done.stderr[-4000:]}"
    assert summary["kills"] >= 5, summary
    assert summary["started_during_kills"] > 0, "the kills must land while jobs run"
    assert summary["duplicates"] == 0
    assert summary["burnt_retries"] == 0
    assert summary["orphans"] == 0
    assert summary["attempts"] == summary["items"] == 150
