"""The installed distribution: entry point, manifest and registrations agree."""

from __future__ import annotations

from importlib import metadata, resources

from conduit_core.extension import MANIFEST_FILENAME, ExecutorRegistration, decode_manifest
from conduit_core.plugins import Plugins
from conduit_executors_python import plugin
from conduit_executors_python.executor import PythonExecutor


def test_python_is_discovered_through_its_installed_entry_point() -> None:
    entry = next(ep for ep in metadata.entry_points(group="conduit") if ep.name == "python")
    assert entry.value == "conduit_executors_python.plugin"
    assert entry.dist is not None
    assert entry.dist.name == "conduit-executors-python"
    assert entry.load() is plugin


def test_manifest_declares_the_registered_generation() -> None:
    raw = resources.files("conduit_executors_python").joinpath(MANIFEST_FILENAME).read_bytes()
    manifest = decode_manifest(raw, source=MANIFEST_FILENAME)
    (python,) = manifest.executors
    assert (python.name, python.pool, python.generation) == ("python", "jobs", 1)
    assert python.historical_generations == []
    assert sorted(python.capabilities) == ["interrupt", "stop", "writes_first"]
    registrations: list[ExecutorRegistration] = plugin.conduit_executors()
    assert [r.generation for r in registrations] == [1]
    assert isinstance(registrations[0].executor, PythonExecutor)


def test_core_loads_it_without_the_shell_plugin_enabled() -> None:
    # It builds on the shell package's code, not on its registration: disabling the shell
    # executor (plugins.disabled) leaves the python executor whole.
    others = {ep.name for ep in metadata.entry_points(group="conduit")} - {"python"}
    plugins = Plugins.load(disabled=others)
    info = plugins.executor_info("python")
    assert (info.pool, info.generation) == ("jobs", 1)
    assert isinstance(plugins.executor("python", 1), PythonExecutor)
