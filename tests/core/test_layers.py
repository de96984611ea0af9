"""The layers of conduit_core point down only, and plugins use only the public contract."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "conduit_core" / "src" / "conduit_core"

#: What each package of conduit_core may import from conduit_core (besides itself).
ALLOWED = {
    "errors": set(),
    # Prometheus instruments and optional traces: recorded into from storage up, reads nothing.
    "telemetry": {"errors"},
    "validation": {"errors"},
    "extension": {"errors", "validation"},
    "model": {"errors", "validation", "extension"},
    # The daemon's side of out-of-process executors: processes and the wire, over the contract.
    "remote": {"errors", "validation", "extension"},
    "plugins": {"errors", "validation", "extension", "remote"},
    "config": {"errors", "validation", "extension", "plugins", "remote"},
    "storage": {"errors", "validation", "extension", "model", "telemetry"},
    "runtime": {
        "errors",
        "validation",
        "extension",
        "model",
        "plugins",
        "remote",
        "config",
        "storage",
        "telemetry",
    },
    "routines": {
        "errors",
        "validation",
        "extension",
        "model",
        "plugins",
        "remote",
        "config",
        "storage",
        "runtime",
        "telemetry",
    },
    # The test kits plugin authors import: they drive the real runtime on a real store.
    "testing": {
        "errors",
        "validation",
        "extension",
        "model",
        "plugins",
        "remote",
        "config",
        "storage",
        "runtime",
        "telemetry",
    },
}
# The web console: an operators' surface over the HTTP API's service layer, never the daemon's or
# the CLI's internals (the daemon mounts it, not the other way round).
ALLOWED["console"] = ALLOWED["routines"] | {"routines", "http"}
# The public Python client speaks HTTP only; config, daemon and http are imported lazily, to find
# a daemon's address and token from its config file (tests/core/test_client_import.py).
ALLOWED["client"] = {"errors", "config", "daemon", "http"}
# The scheduler embedded in a process: the daemon's parts (through its package), answering with the
# client's records; `conduit daemon` runs it too (daemon/_run.py imports it in the function).
ALLOWED["embed"] = ALLOWED["routines"] | {"routines", "daemon", "http", "client"}
#: Top-level modules of conduit_core that import nothing of it: any layer may use them.
LEAVES = ("_version", "_lazy", "_switch_names")
PLUGINS = [
    "conduit_executors_shell",
    "conduit_executors_python",
    "conduit_executors_container",
    "conduit_gate_human",
    "examples/conduit-example-executor",
    "examples/conduit-example-wire",
]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.startswith("conduit_core")}


def _package(path: Path) -> str:
    rel = path.relative_to(CORE)
    return rel.parts[0].removesuffix(".py")


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_layers_point_down_only(package: str) -> None:
    files = [p for p in CORE.rglob("*.py") if _package(p) == package]
    assert files, package
    for path in files:
        for name in _imports(path):
            parts = name.split(".")
            target = parts[1] if len(parts) > 1 else ""
            # _version, _lazy (package exports loaded on first use) and _switch_names (the
            # test-only switch names the CLI checks before loading any layer) import no layer.
            if target in ("", package, *LEAVES):
                continue
            assert target in ALLOWED[package], f"{path.relative_to(REPO)} imports {name}"
            assert not any(p.startswith("_") for p in parts[2:]), (
                f"{path.relative_to(REPO)} reaches into private module {name}"
            )


def test_the_leaf_modules_import_no_layer() -> None:
    for leaf in LEAVES:
        assert _imports(CORE / f"{leaf}.py") == set(), leaf


@pytest.mark.parametrize("plugin", PLUGINS)
def test_plugins_use_only_the_public_contract(plugin: str) -> None:
    for path in (REPO / plugin / "src").rglob("*.py"):
        for name in _imports(path):
            assert name in ("conduit_core.extension", "conduit_core.errors"), (
                f"{path.relative_to(REPO)} imports {name}: plugins use conduit_core.extension only"
            )


def _plugin_module(plugin: str) -> str:
    (package,) = [p.name for p in (REPO / plugin / "src").iterdir() if p.is_dir()]
    return package


@pytest.mark.parametrize("plugin", PLUGINS)
def test_a_plugin_builds_on_another_only_through_its_top_level_package(plugin: str) -> None:
    # conduit-executors-python reuses the shell executor: through the names the shell package
    # exports, never its private modules (which may change in any release of it).
    others = {_plugin_module(p) for p in PLUGINS} - {_plugin_module(plugin)}
    for path in (REPO / plugin / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] in others:
                    assert "." not in name, (
                        f"{path.relative_to(REPO)} imports {name}: another plugin is used through "
                        "its top-level package only"
                    )


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(CORE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _internal_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports anywhere (TYPE_CHECKING blocks and
    function bodies included: a deferred import still ties the two modules together)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & modules


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, or ``None``."""
    done: set[str] = set()
    for start in sorted(graph):
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    return [*trail, nxt]
                if nxt not in trail and nxt not in done:
                    stack.append((nxt, [*trail, nxt]))
        done.add(start)
    return None


def _package_graph(package: str) -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in (CORE / package).rglob("*.py")}
    modules = set(paths)
    return {name: _internal_imports(path, modules) - {name} for name, path in paths.items()}


@pytest.mark.parametrize("package", ["runtime", "daemon", "routines", "storage"])
def test_no_import_circles_inside_a_package(package: str) -> None:
    """A package reads as parts with clear edges: its modules import each other one way only
    (no part takes another back, e.g. a collaborator importing the Scheduler it serves)."""
    circle = _cycle(_package_graph(package))
    assert circle is None, " → ".join(circle or [])


def test_the_circle_check_sees_a_collaborator_taking_the_scheduler_back() -> None:
    # Negative control: runtime/ as it was, with recovery importing the Scheduler it serves.
    graph = _package_graph("runtime")
    assert "conduit_core.runtime._recovery" in graph["conduit_core.runtime._scheduler"]
    graph["conduit_core.runtime._recovery"].add("conduit_core.runtime._scheduler")
    circle = _cycle(graph)
    assert circle is not None
    assert "conduit_core.runtime._recovery" in circle
