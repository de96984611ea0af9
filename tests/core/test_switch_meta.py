"""No shipped distribution can switch a protection off by itself (issue 33, item 6).

A test-only switch is read only by the test plugin's provider (``conduit.test_switches``); the
shipped code names the switch variables in one place, the refusal, and no shipped distribution
registers a provider.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ["conduit_core", "conduit_executors_shell", "conduit_executors_python",
           "conduit_executors_container", "conduit_gate_human"]  # fmt: skip
#: The one shipped module that may name a switch variable (the refusal in extension/_switches.py
#: and the CLI's start use its names).
REFUSAL = REPO / "conduit_core/src/conduit_core/_switch_names.py"


@pytest.mark.parametrize("dist", SHIPPED)
def test_only_the_refusal_names_a_test_switch_variable(dist: str) -> None:
    for path in sorted((REPO / dist / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            named = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if named and "CONDUIT_TEST" in node.value and path != REFUSAL:
                rel = path.relative_to(REPO)
                pytest.fail(
                    f"{rel}:{node.lineno} names {node.value!r}: a shipped module "
                    "reads no test switch (see extension/_switches.py)"
                )


@pytest.mark.parametrize("dist", SHIPPED)
def test_no_shipped_distribution_provides_test_switches(dist: str) -> None:
    project = tomllib.loads((REPO / dist / "pyproject.toml").read_text())["project"]
    assert "conduit.test_switches" not in project.get("entry-points", {}), dist
