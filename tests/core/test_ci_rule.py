"""The CI rule: any CI value counts, and under CI a skip fails the run unless allow-listed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._ci import SKIP_ALLOWED, in_ci, skip_allowed

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("1", True), ("yes", True), ("TRUE", True), ("gitlab", True),
     ("", False), ("0", False), ("false", False), ("no", False)],
)  # fmt: skip
def test_any_ci_value_counts(value: str, expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci() is expected


def test_the_allow_list_is_short_and_says_why() -> None:
    assert len(SKIP_ALLOWED) <= 5
    assert all(len(why) > 20 for _, why in SKIP_ALLOWED)
    assert skip_allowed(
        "tests/storage/test_race.py::test_negative_control_the_race_is_seen_without_its_protection"
        "[sqlite-capacity_check-backends0]"
    )
    assert skip_allowed(
        "tests/container/test_conformance_harness.py::"
        "test_generation_pinning_recovers_with_the_pinned_generation"
    )
    assert not skip_allowed("tests/storage/test_conformance.py::test_anything[postgres]")


def _run_probe(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "probe"
    probe.mkdir(exist_ok=True)
    # The suite's own hooks, imported into the probe's conftest.
    (probe / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (probe / "test_probe.py").write_text(
        "import pytest\n\n\ndef test_needs_a_service():\n    pytest.skip('no service here')\n\n\n"
        "def test_runs():\n    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "-n", "0", "--rootdir", str(probe), "-c", os.devnull, str(probe)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip


def test_a_skip_fails_a_ci_run_and_not_a_local_one(tmp_path: Path) -> None:
    local = _run_probe(tmp_path, None)
    assert local.returncode == 0, local.stdout + local.stderr
    ci = _run_probe(tmp_path, "1")
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "skips not allowed under CI" in ci.stdout
    assert "test_needs_a_service: " in ci.stdout
