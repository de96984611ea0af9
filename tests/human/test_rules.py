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


# --- [plugins.human] in conduit.toml --------------------------------------------------------

HUMAN_TABLE = """
[bindings.deploy]
executor = "shell"
config = { command = "true" }

[plugins.human]
notify = ["true"]

[[plugins.human.rules]]
bindings = ["deploy"]
reason = "from conduit.toml"
"""


def test_the_table_is_decoded_by_the_gates_type_at_config_check() -> None:
    from conduit_core.config import check_against_plugins, parse_config, plugin_configs
    from conduit_core.plugins import Plugins
    from conduit_gate_human._rules import GateConfig, Rule

    plugins = Plugins.load(disabled=())
    config = parse_config(HUMAN_TABLE)
    check_against_plugins(config, plugins)
    decoded = plugin_configs(config, plugins)
    assert decoded == {
        "human": GateConfig(rules=[Rule(bindings=["deploy"], reason="from conduit.toml")],
                            notify=["true"])
    }  # fmt: skip


@pytest.mark.parametrize(
    ("table", "code", "where"),
    [
        (
            '[[plugins.human.rules]]\nbindingz = ["x"]\n',
            "invalid_config",
            "`$.plugins.human.rules[0]`",
        ),
        ("[plugins.human]\nnotify = 3\n", "invalid_config", "`$.plugins.human.notify`"),
        (
            "[plugins.human]\nnotify_timeout_seconds = inf\n",
            "invalid_number",
            "`$.plugins.human.notify_timeout_seconds`",
        ),
        ("[plugins.nope]\nx = 1\n", "unknown_plugin", "$.plugins.nope:"),
        (
            "[plugins.shell]\nx = 1\n",
            "invalid_config",
            "$.plugins.shell: plugin 'shell' takes no configuration",
        ),
        ("[plugins]\nhuman = 3\n", "invalid_config", "`$.plugins.human`"),
    ],
)
def test_a_bad_table_is_refused_with_its_key_path(table: str, code: str, where: str) -> None:
    from conduit_core.config import check_against_plugins, parse_config
    from conduit_core.plugins import Plugins

    with pytest.raises(ConfigError) as refused:
        check_against_plugins(parse_config(table), Plugins.load(disabled=()))
    assert refused.value.code == code
    assert where in refused.value.message


async def test_the_table_wins_over_the_fallback_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import conduit_gate_human.plugin as human
    from conduit_gate_human._rules import GateConfig, Rule

    fallback = tmp_path / "human.toml"
    fallback.write_text('[[rules]]\nbindings = ["build"]\nreason = "from the file"\n')
    monkeypatch.setenv(CONFIG_ENV, str(fallback))
    gate = HumanGate()
    assert await gate.check(request(binding="build")) == StartHold(reason="from the file")
    human.conduit_configure(GateConfig(rules=[Rule(bindings=["deploy"], reason="table")]))
    try:
        assert await gate.check(request(binding="build")) is None  # the file is not read
        assert await gate.check(request()) == StartHold(reason="table")
    finally:
        human.conduit_configure(None)
    # Without a table again the documented fallback applies.
    assert await gate.check(request(binding="build")) == StartHold(reason="from the file")


# --- may_hold: which first starts are asked about at all -----------------------------------


def test_without_config_no_start_is_asked_about(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert not HumanGate().may_hold(request())


async def test_may_hold_selects_exactly_what_the_table_rules_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import conduit_gate_human.plugin as human
    from conduit_gate_human._rules import GateConfig, Rule

    monkeypatch.delenv(CONFIG_ENV, raising=False)
    human.conduit_configure(
        GateConfig(rules=[Rule(bindings=["deploy"], scopes=["prod"], reason="prod deploys")])
    )
    gate = HumanGate()
    try:
        for req in (request(), request(scope="dev"), request(binding="build"),
                    request(kind="run_once")):  # fmt: skip
            held = await gate.check(req)
            assert gate.may_hold(req) == (held is not None), req
        assert gate.may_hold(request())
        assert not gate.may_hold(request(scope="dev"))
    finally:
        human.conduit_configure(None)


def test_with_the_fallback_file_every_start_is_asked_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is read at every question, so only asking can tell (an edit applies at once)."""
    config = tmp_path / "human.toml"
    config.write_text('[[rules]]\nbindings = ["deploy"]\n')
    monkeypatch.setenv(CONFIG_ENV, str(config))
    assert HumanGate().may_hold(request(binding="build"))
