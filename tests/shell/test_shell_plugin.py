"""The installed distribution: entry point, manifest and registrations agree."""

from __future__ import annotations

from importlib import metadata, resources

from conduit_core.extension import MANIFEST_FILENAME, ExecutorRegistration, decode_manifest
from conduit_core.plugins import Plugins
from conduit_executors_shell import ShellExecutor, plugin


def test_shell_is_discovered_through_its_installed_entry_point() -> None:
    entry = next(ep for ep in metadata.entry_points(group="conduit") if ep.name == "shell")
    assert entry.value == "conduit_executors_shell.plugin"
    assert entry.dist is not None
    assert entry.dist.name == "conduit-executors-shell"
    assert entry.load() is plugin


def test_manifest_declares_every_registered_generation() -> None:
    raw = resources.files("conduit_executors_shell").joinpath(MANIFEST_FILENAME).read_bytes()
    manifest = decode_manifest(raw, source=MANIFEST_FILENAME)
    (shell,) = manifest.executors
    assert (shell.name, shell.pool, shell.generation) == ("shell", "jobs", 3)
    assert shell.historical_generations == [2, 1]
    assert sorted(shell.capabilities) == ["inject", "interrupt", "stop", "writes_first"]

    registrations: list[ExecutorRegistration] = plugin.conduit_executors()
    assert sorted(r.generation for r in registrations) == [1, 2, 3]
    for registration in registrations:
        assert isinstance(registration.executor, ShellExecutor)
        assert registration.executor.generation == registration.generation


def test_core_loads_the_plugin_and_serves_each_generation() -> None:
    others = {ep.name for ep in metadata.entry_points(group="conduit")} - {"shell"}
    plugins = Plugins.load(disabled=others)
    info = plugins.executor_info("shell")
    assert (info.pool, info.generation, info.historical_generations) == ("jobs", 3, (2, 1))
    for generation in (1, 2, 3):
        executor = plugins.executor("shell", generation)
        assert isinstance(executor, ShellExecutor)
        assert executor.generation == generation
