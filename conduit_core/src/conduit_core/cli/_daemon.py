"""``conduit daemon`` (and ``daemon drain``), ``conduit daemons`` and ``conduit reload``."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import click

from conduit_core.cli._context import CONFIG_ENV, call, config_option, json_option, load
from conduit_core.errors import ConduitError

__all__ = ["daemon_command", "daemons_command", "reload_command"]


@click.group("daemon", invoke_without_command=True)
@config_option
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--rescan",
    "rescan_s",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between rescans of the store (the safety net behind wake-ups).",
)
@click.pass_context
def daemon_command(
    ctx: click.Context, config_path: Path | None, log_format: str, log_level: str, rescan_s: float
) -> None:
    """Run the host loop and the HTTP API until SIGTERM/SIGINT (a second one exits at once).

    SIGHUP (or `conduit reload`) reloads the config: new attempts use it, live ones keep theirs.
    SIGUSR1 (or `conduit daemon drain`) drains it: no new claims, its running attempts finish,
    then it exits 0.
    """
    if ctx.invoked_subcommand is not None:
        return
    import anyio

    from conduit_core.daemon import Daemon, configure_logging, tune_garbage_collection

    configure_logging("json" if log_format == "json" else "text", log_level)
    path = config_path or Path(os.environ.get(CONFIG_ENV, "conduit.toml"))
    tune_garbage_collection()  # this process is a scheduler host from here on
    anyio.run(Daemon(path, rescan_s=rescan_s).run)


@click.command("reload")
@config_option
def reload_command(config_path: Path | None) -> None:
    """Ask the running daemon to reload its config (SIGHUP to the pid in <data_dir>/daemon.pid)."""
    _, paths = load(config_path)
    pid = paths.running_pid()
    if pid is None:
        raise ConduitError(
            f"no daemon runs for this config (no live pid in {paths.pid_file})",
            code="daemon_not_running",
        )
    os.kill(pid, signal.SIGHUP)
    click.echo(f"reload requested (pid {pid})")


@daemon_command.command("drain")
@config_option
@json_option
def drain_command(config_path: Path | None, as_json: bool) -> None:
    """Drain the running daemon (POST /v1/daemon/drain): it claims nothing new, lets its
    running attempts finish, then exits 0."""
    from conduit_core.cli._context import print_json

    view = call(config_path, lambda api: api.drain())
    if as_json:
        print_json(view)
        return
    click.echo(
        f"draining {view.owner}: {view.running_attempts} running attempt(s) finish, "
        "then it exits"
    )


@click.command("daemons")
@config_option
@json_option
def daemons_command(config_path: Path | None, as_json: bool) -> None:
    """The daemons on the store: host, pid, labels, state, load, last seen."""
    from conduit_core.cli._context import print_json
    from conduit_core.cli._render import console, daemons_table

    listed = call(config_path, lambda api: api.daemons())
    if as_json:
        print_json(listed)
        return
    console().print(daemons_table(listed.daemons))
