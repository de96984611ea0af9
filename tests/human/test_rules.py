"""The human gate's rules, notify command and fail-closed config, without a daemon."""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit_core.errors import ConfigError
from conduit_core.extension import GateRequest, StartHold
from conduit_gate_human._rules import CONFIG_ENV, load_config
from conduit_gate_human.plugin import HumanGate

pytestmark = pytest.mark.anyio


def request(binding: str = "deploy", scope: str = "prod", kind: str = "task") -> GateRequest:
    return GateRequest(work_id="w1", scope=scope, kind=kind, binding=binding, executor="shell")


async def test_without_config_nothing_needs_a_person(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert await HumanGate().check(request()) is None


async def test_a_rule_matches_when_every_key_it_gives_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "human.toml"
    config.write_text(
        '[[rules]]\nbindings = ["deploy"]\nscopes = ["prod"]\nreason = "prod deploys"\n'
        '[[rules]]\nkinds = ["run_once"]\n'
    )
    monkeypatch.setenv(CONFIG_ENV, str(config))
    gate = HumanGate()
    assert await gate.check(request()) == StartHold(reason="prod deploys")
    assert await gate.check(request(scope="dev")) is None
    assert await gate.check(request(binding="build")) is None
    held = await gate.check(request(binding="build", kind="run_once"))
    assert held is not None
    assert "a person must approve" in held.reason


async def test_notify_runs_with_the_hold_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    config = tmp_path / "human.toml"
    config.write_text(f'notify = \'sh -c "env > {out}"\'\n[[rules]]\nreason = "check it"\n')
    monkeypatch.setenv(CONFIG_ENV, str(config))
    assert await HumanGate().check(request()) == StartHold(reason="check it")
    env = out.read_text()
    assert "CONDUIT_WORK_ID=w1" in env
    assert "CONDUIT_BINDING=deploy" in env
    assert "CONDUIT_HOLD_REASON=check it" in env


async def test_a_failing_notify_command_keeps_the_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "human.toml"
    config.write_text('notify = ["/nonexistent/notify"]\n[[rules]]\nreason = "r"\n')
    monkeypatch.setenv(CONFIG_ENV, str(config))
    assert await HumanGate().check(request()) == StartHold(reason="r")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("[[rules]]\nbindingz = []\n", "bindingz"), ("[[rules\n", "invalid TOML")],
)
async def test_a_broken_config_fails_to_decide(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, fragment: str
) -> None:
    config = tmp_path / "human.toml"
    config.write_text(text)
    monkeypatch.setenv(CONFIG_ENV, str(config))
    with pytest.raises(ConfigError, match=fragment):
        load_config()
    with pytest.raises(ConfigError):  # the core fails closed on this and asks again next pass
        await HumanGate().check(request())
