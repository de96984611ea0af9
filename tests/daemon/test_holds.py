"""Held Work through a real daemon, on SQLite and PostgreSQL: the human gate and a budget.

The human gate (conduit-gate-human) holds the first start of Work its rules select; the hold is
listed by ``conduit needs-you``, approved or refused from the CLI, and the approved Work runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import Daemon, wait_for

DEPLOY = """
[bindings.deploy]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}' }}
"""


def needs_you(daemon: Daemon) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(daemon.cli("needs-you", "--json").stdout)["items"]
    return items


def held(daemon: Daemon, work_id: str) -> dict[str, Any] | None:
    return next((item for item in needs_you(daemon) if item["work_id"] == work_id), None)


def test_human_gate_holds_lists_and_runs_once_approved_from_the_cli(
    make_daemon: Callable[..., Daemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notified = tmp_path / "notified.env"
    rules = tmp_path / "human.toml"
    rules.write_text(
        f'notify = ["sh", "-c", "env | grep ^CONDUIT_ > {notified}"]\n'
        '[[rules]]\nbindings = ["deploy"]\nreason = "deploys need a person"\n'
    )
    monkeypatch.setenv("CONDUIT_HUMAN_GATE_CONFIG", str(rules))
    daemon = make_daemon(extra=DEPLOY.format(side=tmp_path / "side-effects.log")).start()

    deploy = json.loads(daemon.cli("work", "submit", "deploy", "--json").stdout)["work"]["id"]
    item = wait_for("the deploy to need a person", lambda: held(daemon, deploy))
    assert item["kind"] == "gate"
    assert item["holder"] == "human"
    assert item["reason"] == "deploys need a person"
    assert f"conduit approve {deploy}" in item["settle"]
    assert deploy in daemon.cli("needs-you").stdout
    env = wait_for("the notify command", lambda: notified.exists() and notified.read_text())
    assert f"CONDUIT_WORK_ID={deploy}" in env
    assert "CONDUIT_BINDING=deploy" in env
    assert "CONDUIT_HOLD_REASON=deploys need a person" in env

    # Negative control: Work no rule selects starts without anyone.
    other = daemon.submit("ok")
    daemon.wait_status(other, "completed")
    assert daemon.show(deploy).work.status == "held"
    assert daemon.runs(deploy) == 0

    # Only the human gate settles its hold: an operator's release is refused.
    refused = daemon.cli("release", deploy, check=False)
    assert refused.returncode != 0
    assert "gate_hold" in refused.stderr

    daemon.cli("approve", deploy, "--reason", "looks fine")
    detail = daemon.wait_status(deploy, "completed")
    assert len(detail.attempts) == 1
    assert daemon.runs(deploy) == 1
    assert held(daemon, deploy) is None

    # A refusal cancels the Work; it never runs.
    second = daemon.submit("deploy")
    wait_for("the second deploy to need a person", lambda: held(daemon, second))
    daemon.cli("refuse", second, "--reason", "not today")
    assert daemon.wait_status(second, "cancelled").attempts == []
    assert daemon.runs(second) == 0
    assert needs_you(daemon) == []


BUDGET = """
[[budgets]]
name = "one-attempt"
unit = "attempts"
max = 1
per = "all"
"""


def test_budget_holds_over_budget_work_until_released(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon(extra=BUDGET).start()
    first = daemon.submit("ok")
    daemon.wait_status(first, "completed")
    second = daemon.submit("ok")
    item = wait_for("the second Work to be held over budget", lambda: held(daemon, second))
    assert item["kind"] == "budget"
    assert "one-attempt" in item["reason"]
    assert "1 of 1 attempts" in item["reason"]
    assert daemon.runs(second) == 0
    daemon.cli("release", second, "--reason", "just this once")
    daemon.wait_status(second, "completed")
    assert daemon.runs(second) == 1
