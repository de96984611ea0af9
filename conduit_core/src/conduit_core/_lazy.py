"""Package exports that load on first use (PEP 562), so importing one light part of a package
(``conduit_core.daemon._paths``, ``conduit_core.http._client``) does not import all the others.

A package keeps its plain imports under ``TYPE_CHECKING`` (what readers and mypy see) and, at
run time, takes ``__getattr__`` and ``__dir__`` from :func:`lazy_exports` with the submodule of
each name in ``__all__``; tests/cli/test_cli_imports.py checks that the two agree.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``where`` maps each exported name to the
    submodule (``_run``) that defines it."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        sub = where.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{sub}"), name)
        namespace[name] = value  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
