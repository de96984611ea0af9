"""``conduit plugins``: what is installed, and the executor programs the config declares."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from conduit_core.cli._context import CONFIG_ENV, config_option, load


@click.group("plugins")
def plugins_group() -> None:
    """Installed executor and gate plugins."""


def _lists_config(config_path: Path | None) -> bool:
    """Whether to read a config for its ``[executors.NAME]`` programs: ``--config``, else
    ``$CONDUIT_CONFIG`` (either must exist), else ``./conduit.toml`` when there is one."""
    return config_path is not None or CONFIG_ENV in os.environ or Path("conduit.toml").exists()


@plugins_group.command("list")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def list_plugins(config_path: Path | None, as_json: bool) -> None:
    """List every executor (package, pool, generations, capabilities), the executor programs
    the config declares ([executors.NAME]) and every gate."""
    from conduit_core.plugins import Plugins

    if _lists_config(config_path):
        config, _ = load(config_path)
        plugins = Plugins.load(programs=config.programs())
    else:
        plugins = Plugins.load()
    executors = [info.to_json() for info in plugins.executors()]
    gates = [info.to_json() for info in plugins.gates()]
    if as_json:
        click.echo(json.dumps({"executors": executors, "gates": gates}, indent=2))
        return
    if not executors and not gates:
        click.echo("no plugins installed")
        return
    for ex in executors:
        historical = ",".join(map(str, ex["historical_generations"])) or "-"
        caps = ",".join(ex["capabilities"]) or "-"
        source = f"package={ex['package']}"
        if ex["declared_in"] is not None:
            source = f"program={' '.join(ex['command'])} (declared in {ex['declared_in']})"
        elif ex["command"] is not None:
            source += f" program={' '.join(ex['command'])}"
        click.echo(
            f"executor {ex['name']:<12} {source} pool={ex['pool'] or '-'} "
            f"generation={ex['generation']} historical={historical} capabilities={caps}"
        )
    for gate in gates:
        click.echo(f"gate     {gate['name']:<12} package={gate['package']}")
