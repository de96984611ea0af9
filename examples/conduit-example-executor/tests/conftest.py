"""Interim marks (removed once the core's relaunch on NotStartedError lands, issue 13)."""

from __future__ import annotations

import pytest

_PENDING = (
    "test_crash_at_each_launch_point_runs_the_job_once[before_intent]",
    "test_crash_at_each_launch_point_runs_the_job_once[after_intent]",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path, _, name = item.nodeid.partition("::")
        if (
            path.endswith("test_example_conformance.py")
            and name.replace("asyncio-", "") in _PENDING
        ):
            item.add_marker(pytest.mark.xfail(reason="issue 13: not on main yet"))
