from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CONDUIT = [sys.executable, "-m", "conduit_core.cli"]


@pytest.fixture
def on_sys_path(tmp_path: Path) -> Iterator[Path]:
    """A folder put on sys.path for this test (fake installed distributions go there)."""
    root = tmp_path / "site"
    root.mkdir()
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith("fakeplug")]:
            del sys.modules[name]


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(
        *args: str, pythonpath: Path | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        environ = dict(os.environ, **env)
        if pythonpath is not None:
            environ["PYTHONPATH"] = str(pythonpath)
        return subprocess.run(
            [*CONDUIT, *args], capture_output=True, text=True, env=environ, timeout=60, check=False
        )

    return run
