"""Binding configs that run a function of ``tests.pyexec.funcs`` in the job's interpreter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def binding(function: str, **more: Any) -> dict[str, Any]:
    """A python binding running ``tests.pyexec.funcs:<function>`` with the repository importable."""
    env = {"PYTHONPATH": str(REPO), **more.pop("env", {})}
    return {"function": f"tests.pyexec.funcs:{function}", "env": env, **more}
