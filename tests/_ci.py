"""One answer to "is this a CI run?", shared by every conftest.

Any non-empty ``CI`` value except ``0``/``false``/``no`` counts (CI services set ``true``, some
set ``1``). Under CI a missing service is a failure, never a skip: :func:`unavailable` fails the
test there and skips it elsewhere, and the suite-wide hook in ``tests/conftest.py`` fails a CI run
that skipped any test not on its allow-list.
"""

from __future__ import annotations

import os
import re
from typing import NoReturn

import pytest

__all__ = ["SKIP_ALLOWED", "in_ci", "skip_allowed", "unavailable"]

#: The only tests a CI run may skip: (node id pattern, why skipping it is right, not a gap).
#: Keep it short; every entry is a promise that the skip says nothing about a missing service.
SKIP_ALLOWED: list[tuple[str, str]] = [
    (
        r"tests/storage/test_race\.py::test_negative_control_the_race_is_seen_without_its_protection",
        "a protection switch that guards nothing on a backend with one writer by nature",
    ),
    (
        r"[\w/.-]+\.py::test_generation_pinning_recovers_with_the_pinned_generation",
        "the executor conformance case for a historical generation, run on an executor that has "
        "only one (the container executor): there is nothing older to pin",
    ),
    (
        r"[\w/.-]+\.py::test_program_killed_mid_run_is_recovered_not_rerun",
        "the executor conformance case that kills an out-of-process executor's program, run on an "
        "in-process executor (shell, python, container, example): there is no program to kill",
    ),
    (
        r"[\w/.-]+\.py::test_writes_first_starts_nothing_before_its_first_write",
        "the executor conformance case for the writes_first promise, run on an executor that does "
        "not make it (the examples): the core then writes the invoke mark itself",
    ),
]

_NOT_CI = ("", "0", "false", "no", "off")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in _NOT_CI


def unavailable(reason: str, *, allow_module_level: bool = False) -> NoReturn:
    """A service or tool the test needs is missing: fail under CI, skip elsewhere.

    ``allow_module_level`` for a whole test file (called at import): under CI its collection
    fails, elsewhere the file is skipped (and the CI rule would count that skip too).
    """
    if in_ci():
        pytest.fail(f"CI={os.environ.get('CI')!r} and {reason} (run scripts/services.sh)")
    pytest.skip(reason, allow_module_level=allow_module_level)


def skip_allowed(nodeid: str) -> bool:
    return any(re.match(pattern, nodeid) for pattern, _ in SKIP_ALLOWED)
