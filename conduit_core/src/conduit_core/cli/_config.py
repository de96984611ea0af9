"""``conduit config``: check a configuration file before a daemon uses it."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group("config")
def config_group() -> None:
    """Configuration files."""


@config_group.command("check")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary when valid.")
def check(file: Path, as_json: bool) -> None:
    """Validate FILE against the schema and the installed plugins (exit 0 when usable)."""
    from conduit_core.config import (
        ROOT_SCOPE,
        check_against_plugins,
        check_bindings_deeply,
        load_config,
    )
    from conduit_core.daemon import check_routine_specs, check_tracing
    from conduit_core.plugins import Plugins

    config = load_config(file)
    plugins = Plugins.load(programs=config.programs())
    check_against_plugins(config, plugins)
    check_bindings_deeply(config, plugins)  # may start processes: here only, never at start
    check_routine_specs(config)
    check_tracing(config.settings.tracing)
    _check_token_files(config)
    summary = {
        "file": str(file),
        "digest": config.digest,
        "scopes": sorted(config.scopes),
        "bindings": sorted(config.bindings),
        "routines": [r.id for r in config.routines],
        "budgets": [b.name for b in config.budgets],
        "tokens": [{"name": t.name, "role": t.role} for t in config.tokens],
    }
    # The root scope is always there; count only the ones the file declares besides it.
    declared_scopes = sum(1 for name in config.scopes if name != ROOT_SCOPE)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(
            f"ok: {file}: {len(config.bindings)} binding(s), {declared_scopes} scope(s), "
            f"{len(config.routines)} routine(s), {len(config.budgets)} budget(s)"
        )


def _check_token_files(config: object) -> None:
    """Refuse a ``[[tokens]]`` file the daemon could not use (missing, open to others, empty)."""
    from conduit_core.config import Config
    from conduit_core.daemon import DaemonPaths
    from conduit_core.http import token_problems

    assert isinstance(config, Config)
    problems = token_problems(config, DaemonPaths.from_config(config).token_file)
    if problems:
        raise problems[0]


@config_group.command("paths")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--get",
    type=click.Choice(["data_dir", "store", "token_file", "pid_file"]),
    help='Print only this path (for scripts: TOKEN=$(cat "$(conduit config paths F --get '
    'token_file)")).',
)
def paths(file: Path, get: str | None) -> None:
    """Where the daemon for FILE keeps its state: data dir, store, token and pid file."""
    from conduit_core.config import load_config
    from conduit_core.daemon import DaemonPaths

    resolved = DaemonPaths.from_config(load_config(file))
    values = {
        "data_dir": str(resolved.data_dir),
        "store": resolved.store,
        "token_file": str(resolved.token_file),
        "pid_file": str(resolved.pid_file),
    }
    if get is not None:
        click.echo(values[get])
        return
    for name, value in values.items():
        click.echo(f"{name}: {value}")
