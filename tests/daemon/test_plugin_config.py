"""``[plugins.NAME]`` through a real daemon: the human gate's rules from conduit.toml.

The gate's table is validated at start, handed over, replaced by a reload, and a bad table is
refused by ``config check`` and by a reload (which keeps the rules in force).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon.conftest import Daemon, wait_for

DEPLOY = """
[bindings.deploy]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}' }}

[plugins.human]
notify = ["sh", "-c", "echo $CONDUIT_WORK_ID >> {root}/notified"]

[[plugins.human.rules]]
bindings = [{bindings}]
reason = "deploys need a person"
"""


def table(tmp_path: Path, *bindings: str) -> str:
    names = ", ".join(f'"{b}"' for b in bindings)
    return DEPLOY.format(side=tmp_path / "side-effects.log", root=tmp_path, bindings=names)


def config_check(daemon: Daemon) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conduit_core.cli", "config", "check", str(daemon.config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def reload(daemon: Daemon) -> None:
    before = daemon.log().count("config reloaded")
    daemon.signal(signal.SIGHUP)
    wait_for("the reload", lambda: daemon.log().count("config reloaded") > before)


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_the_gate_takes_its_rules_from_conduit_toml_and_a_reload_replaces_them(
    make_daemon: Callable[..., Daemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONDUIT_HUMAN_GATE_CONFIG", raising=False)
    daemon = make_daemon(extra=table(tmp_path, "deploy"))
    assert config_check(daemon).returncode == 0
    daemon.start()

    held = daemon.submit("deploy")
    detail = daemon.wait_status(held, "held")
    assert detail.holds[0].holder == "human"
    assert detail.holds[0].reason == "deploys need a person"
    wait_for("the notify command", lambda: (tmp_path / "notified").exists())
    other = daemon.submit("ok")  # negative control: no rule selects it
    daemon.wait_status(other, "completed")

    # A reload with the rule moved to "ok" applies to the next first start.
    daemon.write_config(extra=table(tmp_path, "ok"))
    reload(daemon)
    deploy = daemon.submit("deploy")
    daemon.wait_status(deploy, "completed")
    gated_ok = daemon.submit("ok")
    daemon.wait_status(gated_ok, "held")

    # A bad table is refused by config check and by a reload; the rules in force stay.
    daemon.write_config(extra=table(tmp_path, "ok") + "bogus = 1\n")
    refused = config_check(daemon)
    assert refused.returncode != 0
    assert "$.plugins.human" in refused.stderr
    assert "bogus" in refused.stderr
    before = daemon.log().count("reload refused")
    daemon.signal(signal.SIGHUP)
    wait_for("the refusal", lambda: daemon.log().count("reload refused") > before)
    assert "$.plugins.human" in daemon.log()
    still = daemon.submit("ok")
    daemon.wait_status(still, "held")  # the last good rules are still in force


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_a_bad_table_stops_the_daemon_at_start(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    daemon = make_daemon(extra="[plugins.human]\nrules = 3\n")
    daemon.start(wait=False)
    assert daemon.wait_exit() != 0
    assert "$.plugins.human.rules" in daemon.log()
