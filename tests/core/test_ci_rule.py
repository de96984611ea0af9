"""The CI rule: any CI value counts, and under CI a skip fails the run unless allow-listed."""

from __future__ import annotations

import os
import re
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


CI_VALUES = ["true", "1", "yes", "TRUE", "gitlab", " true ", "", "0", "false", "no", "off", " Off "]


@pytest.mark.parametrize("value", CI_VALUES)
def test_the_scripts_decide_like_the_suite(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", value)
    done = subprocess.run(
        ["bash", "-c", f". {REPO / 'scripts' / 'ci.sh'} && is_ci"], timeout=30, check=False
    )
    assert (done.returncode == 0) is in_ci(), f"CI={value!r}: scripts/ci.sh and tests/_ci.py differ"


def test_nothing_else_reads_ci() -> None:
    """One rule: tests/_ci.py for Python, scripts/ci.sh for the scripts; nobody reads CI itself."""
    readers = re.compile(r"""environ(\.get)?[\[(]\s*["']CI["']|getenv\(\s*["']CI["']|\$\{?CI\b""")
    allowed = {REPO / "tests" / "_ci.py", REPO / "scripts" / "ci.sh", Path(__file__)}
    files = [*REPO.glob("tests/**/*.py"), *REPO.glob("examples/**/*.py"),
             *REPO.glob("bench/**/*.py"), *REPO.glob("scripts/*"), *REPO.glob(".ci/*")]  # fmt: skip
    offenders = [
        str(path.relative_to(REPO))
        for path in files
        if path.is_file() and path not in allowed and readers.search(path.read_text())
    ]
    assert offenders == [], f"use tests._ci.in_ci / scripts/ci.sh's is_ci: {offenders}"


PROBE_TESTS = (
    "import pytest\n\n\ndef test_needs_a_service():\n    pytest.skip('no service here')\n\n\n"
    "def test_runs():\n    pass\n"
)
# A whole file skipped at import: no test report ever says so, only its collection report.
PROBE_MODULE_SKIP = (
    "import pytest\n\npytest.skip('no tool here', allow_module_level=True)\n\n\n"
    "def test_never_collected():\n    pass\n"
)


def _run_probe(
    tmp_path: Path, ci: str | None, files: dict[str, str], *, workers: int = 0
) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "probe"
    probe.mkdir(exist_ok=True)
    # The suite's own hooks, imported into the probe's conftest.
    (probe / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    for name, text in files.items():
        (probe / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "-n", str(workers), "--rootdir", str(probe), "-c", os.devnull, str(probe)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip


def test_a_skip_fails_a_ci_run_and_not_a_local_one(tmp_path: Path) -> None:
    files = {"test_probe.py": PROBE_TESTS}
    local = _run_probe(tmp_path, None, files)
    assert local.returncode == 0, local.stdout + local.stderr
    ci = _run_probe(tmp_path, "1", files)
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "skips not allowed under CI" in ci.stdout
    assert "test_needs_a_service: " in ci.stdout


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "xdist"])
def test_a_module_level_skip_fails_a_ci_run(tmp_path: Path, workers: int) -> None:
    files = {"test_probe.py": "def test_runs():\n    pass\n", "test_tool.py": PROBE_MODULE_SKIP}
    if workers == 0:  # outside CI the skip is only a skip (xdist changes nothing there)
        local = _run_probe(tmp_path, None, files)
        assert local.returncode == 0, local.stdout + local.stderr
    ci = _run_probe(tmp_path, "true", files, workers=workers)
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "skips not allowed under CI" in ci.stdout, ci.stdout
    assert "test_tool.py: no tool here" in ci.stdout, ci.stdout
    assert "1 test(s) skipped under CI" in ci.stdout, ci.stdout


def test_unavailable_at_module_level_skips_locally_and_fails_collection_under_ci(
    tmp_path: Path,
) -> None:
    files = {
        "test_probe.py": "def test_runs():\n    pass\n",
        "test_needs_node.py": "from tests._ci import unavailable\n\n"
        "unavailable('node is not on PATH', allow_module_level=True)\n",
    }
    local = _run_probe(tmp_path, None, files)
    assert local.returncode == 0, local.stdout + local.stderr
    ci = _run_probe(tmp_path, "yes", files)
    assert ci.returncode != 0, ci.stdout + ci.stderr
    assert "CI='yes' and node is not on PATH" in ci.stdout, ci.stdout
