"""Plugin loading through real entry points, the manifest cross-check and generations."""

from __future__ import annotations

import json
from pathlib import Path

import importlib_metadata
import pytest

from conduit_core.errors import (
    DuplicateRegistrationError,
    ManifestError,
    UnsupportedGenerationError,
)
from conduit_core.plugins import Plugins

from ._fake_dist import executor_manifest, executor_source, write_plugin_dist

BUNDLED = {
    "shell": "conduit-executors-shell",
    "python": "conduit-executors-python",
    "container": "conduit-executors-container",
    "human": "conduit-gate-human",
}


def test_bundled_packages_are_discovered_through_their_entry_points() -> None:
    eps = {ep.name: ep for ep in importlib_metadata.entry_points(group="conduit")}
    for name, dist in BUNDLED.items():
        assert name in eps, f"{dist} is not installed with a 'conduit' entry point {name!r}"
        assert eps[name].dist is not None
        assert eps[name].dist.name == dist
    loaded = {p.name: p.package for p in Plugins.load(disabled=()).loaded}
    for name, dist in BUNDLED.items():
        assert loaded[name] == dist


def test_test_plugin_lists_both_generations_and_resolves_each() -> None:
    plugins = Plugins.load(disabled=())
    info = plugins.executor_info("echo")
    assert info.package == "conduit-test-plugin"
    assert info.generation == 2
    assert info.historical_generations == (1,)
    assert info.capabilities == ("inject", "stop", "writes_first")
    current = plugins.executor("echo", 2)
    historical = plugins.executor("echo", 1)
    assert current is not historical
    assert getattr(historical, "generation", None) == 1
    assert getattr(current, "generation", None) == 2


def test_unknown_generation_raises_unsupported_generation_naming_executor() -> None:
    plugins = Plugins.load(disabled=())
    with pytest.raises(UnsupportedGenerationError) as caught:
        plugins.executor("echo", 7)
    err = caught.value
    assert err.code == "unsupported_generation"
    assert "'echo' generation 7" in err.message
    assert "installed generations: 1, 2" in err.message
    assert "install" in err.message
    # Never a fallback: the lookup error is also a LookupError.
    assert isinstance(err, LookupError)


def test_disabled_plugins_env_blocks_a_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDUIT_DISABLED_PLUGINS", "test-plugin, other")
    plugins = Plugins.load()
    assert "echo" not in {info.name for info in plugins.executors()}
    assert "test-plugin" not in {p.name for p in plugins.loaded}


def test_plugins_list_json_reads_manifests(run_cli) -> None:  # type: ignore[no-untyped-def]
    proc = run_cli("plugins", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"executors", "gates"}
    echo = next(e for e in doc["executors"] if e["name"] == "echo")
    assert echo == {
        "name": "echo",
        "package": "conduit-test-plugin",
        "plugin": "test-plugin",
        "pool": None,
        "generation": 2,
        "historical_generations": [1],
        "capabilities": ["inject", "stop", "writes_first"],
        # In process: no program, declared by no config file (issue 33: programs are listed).
        "command": None,
        "declared_in": None,
    }
    assert {"name": "test-allow", "package": "conduit-test-plugin", "plugin": "test-plugin"} in doc[
        "gates"
    ]


# --- bad plugins: each refused with one message naming the package, file and field ----------


def _dist(root: Path, dist: str, module: str, *, manifest: str | None, source: str) -> None:
    write_plugin_dist(root, dist=dist, module=module, source=source, manifest=manifest)


def test_manifest_declaring_an_unregistered_generation_is_refused(on_sys_path: Path) -> None:
    _dist(
        on_sys_path,
        "fakeplug-a",
        "fakeplug_a",
        manifest=executor_manifest("fakeplug-a", "alpha", 2, "[1]"),
        source=executor_source("alpha", 2),
    )
    with pytest.raises(ManifestError) as caught:
        Plugins.load(disabled=())
    msg = caught.value.message
    assert "package 'fakeplug-a'" in msg
    assert "conduit-manifest.toml" in msg
    assert "$.executors[0]" in msg
    assert "generation(s) [1]" in msg


def test_registration_missing_from_manifest_is_refused(on_sys_path: Path) -> None:
    _dist(
        on_sys_path,
        "fakeplug-b",
        "fakeplug_b",
        manifest='schema = 1\npackage = "fakeplug-b"\n',
        source=executor_source("beta", 1),
    )
    with pytest.raises(ManifestError, match=r"registers executor 'beta' but \$\.executors"):
        Plugins.load(disabled=())


def test_two_packages_registering_one_executor_name_is_an_error_naming_both(
    on_sys_path: Path,
) -> None:
    for dist, module in (("fakeplug-c", "fakeplug_c"), ("fakeplug-d", "fakeplug_d")):
        _dist(
            on_sys_path,
            dist,
            module,
            manifest=executor_manifest(dist, "gamma", 1),
            source=executor_source("gamma", 1),
        )
    with pytest.raises(DuplicateRegistrationError) as caught:
        Plugins.load(disabled=())
    assert caught.value.code == "duplicate_registration"
    assert "'fakeplug-c'" in caught.value.message
    assert "'fakeplug-d'" in caught.value.message


def test_missing_manifest_is_refused(on_sys_path: Path) -> None:
    _dist(on_sys_path, "fakeplug-e", "fakeplug_e", manifest=None, source=executor_source("e", 1))
    with pytest.raises(ManifestError, match=r"package 'fakeplug-e' .* ships no conduit-manifest"):
        Plugins.load(disabled=())


def test_manifest_with_unknown_key_is_refused(on_sys_path: Path) -> None:
    manifest = executor_manifest("fakeplug-f", "phi", 1) + "colour = 'red'\n"
    _dist(
        on_sys_path, "fakeplug-f", "fakeplug_f", manifest=manifest, source=executor_source("phi", 1)
    )
    with pytest.raises(ManifestError) as caught:
        Plugins.load(disabled=())
    assert "unknown field `colour`" in caught.value.message
    assert "$.executors[0]" in caught.value.message


def test_manifest_naming_another_package_is_refused(on_sys_path: Path) -> None:
    _dist(
        on_sys_path,
        "fakeplug-g",
        "fakeplug_g",
        manifest=executor_manifest("somebody-else", "g", 1),
        source=executor_source("g", 1),
    )
    with pytest.raises(ManifestError, match=r"\$\.package: says 'somebody-else'"):
        Plugins.load(disabled=())


def test_cli_refuses_bad_plugin_with_message_and_exit_code(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    site.mkdir()
    for dist, module in (("fakeplug-h", "fakeplug_h"), ("fakeplug-i", "fakeplug_i")):
        _dist(
            site,
            dist,
            module,
            manifest=executor_manifest(dist, "eta", 1),
            source=executor_source("eta", 1),
        )
    proc = run_cli("plugins", "list", "--json", pythonpath=site)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith("error [duplicate_registration]: executor 'eta'")
    assert "'fakeplug-h'" in proc.stderr
    assert "'fakeplug-i'" in proc.stderr


def test_plugins_list_json_shows_the_bundled_executors_and_gate(run_cli) -> None:  # type: ignore[no-untyped-def]
    proc = run_cli("plugins", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    executors = {e["name"]: e for e in doc["executors"]}
    assert executors["shell"]["package"] == "conduit-executors-shell"
    assert executors["shell"]["pool"] == "jobs"
    assert executors["shell"]["generation"] == 3
    assert executors["shell"]["historical_generations"] == [2, 1]
    assert executors["container"]["package"] == "conduit-executors-container"
    assert executors["container"]["pool"] == "jobs"
    assert "isolated" in executors["container"]["capabilities"]
    assert {"name": "human", "package": "conduit-gate-human", "plugin": "human"} in doc["gates"]
