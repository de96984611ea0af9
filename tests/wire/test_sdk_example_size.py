"""The wire SDK's promise: a complete out-of-process executor in under 60 lines of code."""

from __future__ import annotations

import ast
from pathlib import Path

EXAMPLE = (
    Path(__file__).resolve().parents[2]
    / "examples/conduit-example-wire/src/conduit_example_wire/__init__.py"
)


def _code_lines(source: str) -> int:
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            docstrings.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return sum(
        1
        for number, line in enumerate(source.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and number not in docstrings
    )


def test_the_python_wire_example_is_under_60_lines_of_code() -> None:
    # Everything of the executor is in this one module: config, typed result data, run,
    # recover, stop, the manifest and main().
    assert _code_lines(EXAMPLE.read_text()) < 60
