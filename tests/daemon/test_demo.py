"""The README's first command ends in ``python -m conduit_core.demo``: it must work, quickly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conduit_core.plugins import Plugins


def test_demo_runs_through_the_daemon(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "conduit_core.demo", "--dir", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "conduit work list" in done.stdout
    assert "daemon exited with status 0" in done.stdout
    assert "Routine conduit:every-5s" in done.stdout
    listing = done.stdout.split("$ conduit work list")[1].split("$ conduit work show")[0]
    submitted = [line for line in listing.splitlines() if line.startswith("w-")]
    # The shell jobs, and a Python function with its typed result where the executor is installed.
    with_python = "python" in {info.name for info in Plugins.load().executors()}
    assert len(submitted) == 4 + with_python
    if with_python:
        assert "the Python function summarize returned {'count': 6, 'total': 23.0}" in done.stdout
    assert all(" completed " in line for line in submitted)
    fired = [line for line in listing.splitlines() if line.startswith("routine:every-5s:")]
    assert fired, "the demo Routine's fire shows in the history"
