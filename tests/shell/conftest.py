"""Interim marks for the shell executor's conformance run (removed once issue 13 lands)."""

from __future__ import annotations

import pytest

# Until the core's NotStartedError handling lands on main (issue 13), recovery fails these
# attempts instead of relaunching them. The marks go on the collected items, never on
# the shared case functions, which other executors' modules import too.
_PENDING = (
    "test_crash_at_each_launch_point_runs_the_job_once[before_intent]",
    "test_crash_at_each_launch_point_runs_the_job_once[after_intent]",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path, _, name = item.nodeid.partition("::")
        if path.endswith("shell/test_conformance_harness.py") and name in _PENDING:
            item.add_marker(pytest.mark.xfail(reason="issue 13: not on main yet"))
