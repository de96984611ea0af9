"""The root ``conduit`` group and the error handling every subcommand shares."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from conduit_core._switch_names import SWITCH_VARIABLES
from conduit_core._version import __version__
from conduit_core.cli._approvals import (
    approve_command,
    needs_you_command,
    refuse_command,
    release_command,
)
from conduit_core.cli._config import config_group
from conduit_core.cli._daemon import daemon_command, daemons_command, reload_command
from conduit_core.cli._doctor import doctor_command
from conduit_core.cli._plugins import plugins_group
from conduit_core.cli._routines import routines_group
from conduit_core.cli._work import capacity_command, work_group
from conduit_core.errors import ConduitError

__all__ = ["cli", "main"]


#: Exit status of a command refused because of bad input or a failed check.
EXIT_ERROR = 1


class _ConduitGroup(click.Group):
    """Turns a :class:`ConduitError` into one clear line on stderr and a non-zero exit."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConduitError as exc:
            click.echo(f"error [{exc.code}]: {exc.message}", err=True)
            ctx.exit(EXIT_ERROR)


@click.group(cls=_ConduitGroup)
@click.version_option(__version__, prog_name="conduit")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """conduit: a durable execution scheduler."""
    # doctor reports a stray switch as a failed check. Without a switch variable set there is
    # nothing to refuse, and the providers' lookup (every installed distribution's entry
    # points) is left to what needs it: the store, the daemon (a read of a daemon does not).
    if ctx.invoked_subcommand != "doctor" and any(os.environ.get(n) for n in SWITCH_VARIABLES):
        from conduit_core.extension import refuse_unprovided_switches

        refuse_unprovided_switches()


cli.add_command(plugins_group)
cli.add_command(config_group)
cli.add_command(daemon_command)
cli.add_command(daemons_command)
cli.add_command(reload_command)
cli.add_command(work_group)
cli.add_command(capacity_command)
cli.add_command(doctor_command)
cli.add_command(approve_command)
cli.add_command(refuse_command)
cli.add_command(release_command)
cli.add_command(needs_you_command)
cli.add_command(routines_group)


def main() -> None:
    cli(prog_name="conduit")
    sys.exit(0)
