"""One answer to "is this a CI run?", shared by every conftest.

Any non-empty ``CI`` value except ``0``/``false``/``no`` counts (CI services set ``true``, some
set ``1``). Under CI a missing service is a failure, never a skip: :func:`unavailable` fails the
test there and skips it elsewhere, and the suite-wide hook in ``tests/conftest.py`` fails a CI run
that skipped any test not on its allow-list.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["in_ci", "unavailable"]

_NOT_CI = ("", "0", "false", "no", "off")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in _NOT_CI


def unavailable(reason: str) -> NoReturn:
    """A service or tool the test needs is missing: fail under CI, skip elsewhere."""
    if in_ci():
        pytest.fail(f"CI={os.environ.get('CI')!r} and {reason} (run scripts/services.sh)")
    pytest.skip(reason)
