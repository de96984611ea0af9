"""scripts/setup.sh keeps the test-only plugins in the test environment (issue 16, rough edge 3).

A user's venv (the demo, the README's usage) never gets them, and loses them if an earlier set-up
put them there; scripts/test.sh asks for them, in a venv of its own. Checked with the script's dry
run against this very venv, which has them (it is the test environment).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(**env: str) -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh")],
        env={**os.environ, "CONDUIT_VENV": sys.prefix, "CONDUIT_SKIP_SERVICES": "1",
             "CONDUIT_SETUP_DRY_RUN": "1", **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _would_install(out: str) -> list[str]:
    line = next(x for x in out.splitlines() if "dry run: would install" in x)
    return line.split("would install ", 1)[1].split()


def test_a_users_venv_gets_no_test_plugin_and_loses_one_it_has() -> None:
    out = _dry_run(CONDUIT_TEST_PLUGINS="0")
    assert "conduit-test-plugin" not in _would_install(out)
    assert "conduit-core" in _would_install(out)
    removal = next(x for x in out.splitlines() if "would remove test-only plugins" in x)
    assert removal.endswith("conduit-test-plugin")


def test_the_test_environment_gets_them() -> None:
    out = _dry_run(CONDUIT_TEST_PLUGINS="1")
    assert "conduit-test-plugin" in _would_install(out)
    assert "would remove" not in out


def test_the_test_command_uses_a_venv_of_its_own_with_test_plugins() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert 'CONDUIT_VENV="${CONDUIT_VENV:-$ROOT/.venv-test}"' in script
    assert "export CONDUIT_TEST_PLUGINS=1" in script
    assert "CONDUIT_TEST_PLUGINS=0 " in (ROOT / "scripts" / "demo.sh").read_text()
