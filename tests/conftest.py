"""Suite-wide fixtures and the CI skip rule.

Async tests use anyio's pytest plugin (``@pytest.mark.anyio``). Under CI (``tests/_ci.py``) a
skipped test fails the run unless it is on ``SKIP_ALLOWED``: a missing service, tool or
privilege must never turn into a green run that tested nothing. Both kinds of skip count: a
test's (its report) and a whole file's or folder's (``pytest.skip(allow_module_level=True)``,
``importorskip``: only a collection report says so, no test report ever does).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tests._ci import in_ci, skip_allowed

# Property-based tests: bounded in CI ("default"); HYPOTHESIS_PROFILE=long for a manual run.
# A test's own @settings(max_examples=…) still wins. No deadline: the machine is shared.
settings.register_profile("default", max_examples=60, deadline=None)
settings.register_profile("long", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

_skipped: dict[str, str] = {}


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    return str(reason).removeprefix("Skipped: ")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Under xdist this runs on the controller for every worker's reports too.
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped[report.nodeid] = _skip_reason(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    # Under xdist the controller gets every worker's skipped collection (xdist sends those only).
    if report.skipped:
        _skipped[report.nodeid or "(the whole session)"] = _skip_reason(report)


def _forbidden_skips() -> dict[str, str]:
    return {n: r for n, r in _skipped.items() if not skip_allowed(n)} if in_ci() else {}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller sees every report and decides
    if _forbidden_skips() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    forbidden = _forbidden_skips()
    if not forbidden or hasattr(terminalreporter.config, "workerinput"):
        return
    terminalreporter.section("skips not allowed under CI", sep="=", red=True, bold=True)
    for nodeid, reason in sorted(forbidden.items()):
        terminalreporter.line(f"{nodeid}: {reason}")
    terminalreporter.line(
        f"{len(forbidden)} test(s) skipped under CI; a CI run fails on any skip not on "
        "tests/_ci.py SKIP_ALLOWED (see tests/README.md)"
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Configs without ``data_dir`` keep their state in a per-test folder, not the user's home."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state-home")))


@pytest.fixture(autouse=True, scope="session")
def _switches_read_before_any_test() -> None:
    """The test process's own switches are read once (``_switches._installed`` is cached per
    process), now, with none set: a test that sets ``CONDUIT_TEST_UNSAFE`` for the processes it
    spawns must not switch a protection off for every later test in its worker (run first in
    a worker, the capacity race's negative control left the capacity check off there)."""
    from conduit_core.extension._switches import active_switches

    assert not active_switches().protections_off, "a protection is off in the test process"
