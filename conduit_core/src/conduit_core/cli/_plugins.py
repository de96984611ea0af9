"""``conduit plugins``: what is installed."""

from __future__ import annotations

import json

import click

from conduit_core.plugins import Plugins


@click.group("plugins")
def plugins_group() -> None:
    """Installed executor and gate plugins."""


@plugins_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def list_plugins(as_json: bool) -> None:
    """List every executor (package, pool, generations, capabilities) and every gate."""
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
        click.echo(
            f"executor {ex['name']:<12} package={ex['package']} pool={ex['pool'] or '-'} "
            f"generation={ex['generation']} historical={historical} capabilities={caps}"
        )
    for gate in gates:
        click.echo(f"gate     {gate['name']:<12} package={gate['package']}")
