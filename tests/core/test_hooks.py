"""Each hook spec has a test of its own here, and a meta-test keeps that (and the docs) true."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from conduit_core.errors import (
    ConduitError,
    DuplicateRegistrationError,
    UnsupportedGenerationError,
)
from conduit_core.extension import GateRequest, HookSpecs, InputEvent, RetryHint, StartHold
from conduit_core.plugins import Plugins

REPO = Path(__file__).resolve().parents[2]
HOOK_NAMES = sorted(n for n in vars(HookSpecs) if n.startswith("conduit_"))


def test_hook_conduit_executors_registers_each_generation() -> None:
    plugins = Plugins.load(disabled=())
    # Each generation resolves to the implementation registered for it (the test plugin's echo
    # executor knows its generation), and a generation nobody registered is refused.
    assert getattr(plugins.executor("echo", 1), "generation", None) == 1
    assert getattr(plugins.executor("echo", 2), "generation", None) == 2
    with pytest.raises(UnsupportedGenerationError) as caught:
        plugins.executor("echo", 3)
    assert caught.value.code == "unsupported_generation"


@pytest.mark.anyio
async def test_hook_conduit_start_gates_registers_gates_in_name_order() -> None:
    plugins = Plugins.load(disabled=())
    gates = plugins.start_gates()
    assert [g.name for g in gates] == sorted(g.name for g in gates)
    gate = next(g for g in gates if g.name == "test-allow").gate
    request = GateRequest(
        work_id="w1",
        scope="root",
        kind="task",
        binding="b",
        executor="echo",
        first_input=InputEvent(id="e1", type="input", payload={"hold": "needs a person"}),
    )
    assert await gate.check(request) == StartHold(reason="needs a person")
    let = GateRequest(work_id="w2", scope="root", kind="task", binding="b", executor="echo")
    assert await gate.check(let) is None


def test_hook_conduit_run_environment_merges_per_scope_chain() -> None:
    plugins = Plugins.load(disabled=())
    assert plugins.run_environment(("root", "test-env")) == {"CONDUIT_TEST_ENV": "from-test-plugin"}
    assert plugins.run_environment(("root",)) == {}


def test_hook_conduit_run_environment_failure_is_environment_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import conduit_test_plugin.plugin as tp

    plugins = Plugins.load(disabled=())

    def broken(scope_chain: object) -> None:
        raise RuntimeError("vault sealed: secret=hunter2")

    impl = next(
        i for i in plugins._pm.hook.conduit_run_environment.get_hookimpls() if i.plugin is tp
    )
    monkeypatch.setattr(impl, "function", broken)
    with pytest.raises(ConduitError) as caught:
        plugins.run_environment(("root",))
    assert caught.value.code == "environment_unavailable"
    assert "hunter2" not in caught.value.message  # the error text may carry a secret


def test_hook_conduit_retry_hint_classifies_failures() -> None:
    plugins = Plugins.load(disabled=())
    hint = plugins.retry_hint("echo", RuntimeError("rate limited by provider"), None)
    assert hint == RetryHint(unknown_reset=True, reason="rate limited")
    assert plugins.retry_hint("echo", RuntimeError("boom"), None) is None
    assert plugins.retry_hint("shell", RuntimeError("rate limited"), None) is None


@pytest.mark.anyio
async def test_hook_conduit_schedule_sources_adds_observe_only_sources() -> None:
    plugins = Plugins.load(disabled=())
    (source,) = [s for s in plugins.schedule_sources() if s.name == "test-remote"]
    read = await source.read()
    assert [r.id for r in read.records] == ["test-remote:nightly"]
    assert source.manageability == "observe-only"
    # A name the core uses (or another plugin took) is refused, never shadowed.
    with pytest.raises(DuplicateRegistrationError, match="'test-remote'"):
        plugins.schedule_sources(reserved=("test-remote",))


def test_hook_conduit_config_type_declares_the_plugins_table_type() -> None:
    from conduit_gate_human._rules import GateConfig

    plugins = Plugins.load(disabled=())
    assert plugins.config_type("human") is GateConfig
    assert plugins.config_type("shell") is None  # installed, takes no config
    with pytest.raises(ConduitError) as caught:
        plugins.config_type("no-such-plugin")
    assert caught.value.code == "unknown_plugin"
    assert "human" in caught.value.message  # names what is loaded
    # A blocked plugin is not loaded: its table is unknown too.
    with pytest.raises(ConduitError, match="CONDUIT_DISABLED_PLUGINS"):
        Plugins.load(disabled=("human",)).config_type("human")


@pytest.mark.anyio
async def test_hook_conduit_configure_hands_the_decoded_table_over() -> None:
    import conduit_gate_human.plugin as human
    from conduit_gate_human._rules import GateConfig, Rule

    plugins = Plugins.load(disabled=())
    gate = next(g.gate for g in plugins.start_gates() if g.name == "human")
    request = GateRequest(work_id="w1", scope="root", kind="task", binding="deploy", executor="e")
    try:
        plugins.configure({"human": GateConfig(rules=[Rule(bindings=["deploy"], reason="r")])})
        assert await gate.check(request) == StartHold(reason="r")
        plugins.configure({})  # the table is gone: the plugin is told so (None)
        assert human._configured is None
        assert await gate.check(request) is None
    finally:
        plugins.configure({})


def test_hook_conduit_configure_refusal_names_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    import conduit_gate_human.plugin as human

    plugins = Plugins.load(disabled=())

    def refuse(config: object) -> None:
        raise ValueError("rules must not be empty")

    impl = next(i for i in plugins._pm.hook.conduit_configure.get_hookimpls() if i.plugin is human)
    monkeypatch.setattr(impl, "function", refuse)
    with pytest.raises(ConduitError) as caught:
        plugins.configure({})
    assert caught.value.code == "plugin_config_refused"
    assert "[plugins.human]" in caught.value.message


def test_every_hook_spec_is_documented_and_has_a_test_of_its_own() -> None:
    assert HOOK_NAMES == [
        "conduit_config_type",
        "conduit_configure",
        "conduit_executors",
        "conduit_retry_hint",
        "conduit_run_environment",
        "conduit_schedule_sources",
        "conduit_start_gates",
    ]
    docs = (REPO / "docs" / "plugins.md").read_text()
    tests = "\n".join(p.read_text() for p in (REPO / "tests").rglob("test_*.py"))
    for name in HOOK_NAMES:
        spec = getattr(HookSpecs, name)
        assert inspect.getdoc(spec), f"hook spec {name} has no docstring"
        assert re.search(rf"^#+ .*`{name}`", docs, re.M), (
            f"docs/plugins.md has no section on {name}"
        )
        assert re.search(rf"def test_hook_{name}_", tests), f"no test named test_hook_{name}_*"
