"""Each distribution builds a wheel that carries its manifest and installs and imports alone."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = {
    "conduit_core": ("conduit_core", None),
    "conduit_executors_shell": ("conduit_executors_shell", "shell"),
    "conduit_executors_python": ("conduit_executors_python", "python"),
    "conduit_executors_container": ("conduit_executors_container", "container"),
    "conduit_gate_human": ("conduit_gate_human", "human"),
}


@pytest.mark.parametrize("folder", sorted(DISTRIBUTIONS))
def test_distribution_builds_installs_and_imports_alone(folder: str, tmp_path: Path) -> None:
    module, entry = DISTRIBUTIONS[folder]
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(REPO / folder)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    (wheel,) = wheels.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert f"{module}/py.typed" in names
    if entry is not None:
        assert f"{module}/conduit-manifest.toml" in names
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    # Import from the installed wheel (not the source tree), and load plugins through its own
    # entry point metadata.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        f"import {module};"
        f"assert {module}.__file__.startswith(sys.argv[1]), {module}.__file__;"
        "from conduit_core.plugins import Plugins;"
        "loaded = {p.name: p for p in Plugins.load(disabled=()).loaded};"
        f"entry = {entry!r};"
        "assert entry is None or loaded[entry].manifest_path.startswith(sys.argv[1]), loaded"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(target)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
