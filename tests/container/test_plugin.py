"""The package is found through its real entry point and its manifest matches what it registers."""

from __future__ import annotations

from importlib.metadata import entry_points

from conduit_core.extension import Capability
from conduit_core.plugins import Plugins
from conduit_executors_container import ContainerExecutor


def test_discovered_through_the_conduit_entry_point() -> None:
    [ep] = [ep for ep in entry_points(group="conduit") if ep.name == "container"]
    assert ep.value == "conduit_executors_container.plugin"
    assert ep.dist is not None
    assert ep.dist.name == "conduit-executors-container"
    [registration] = ep.load().conduit_executors()
    assert (registration.name, registration.generation) == ("container", 1)
    assert isinstance(registration.executor, ContainerExecutor)


def test_core_loads_it_and_its_manifest_agrees() -> None:
    others = {ep.name for ep in entry_points(group="conduit")} - {"container"}
    plugins = Plugins.load(disabled=others)
    info = plugins.executor_info("container")
    assert info.package == "conduit-executors-container"
    assert info.pool == "jobs"
    assert info.generation == 1
    assert set(info.capabilities) == {
        Capability.INTERRUPT,
        Capability.STOP,
        Capability.ISOLATED,
        Capability.WRITES_FIRST,
    }
    assert isinstance(plugins.executor("container", 1), ContainerExecutor)
