"""The Work filters as CLI options, shared by ``conduit work list`` and ``conduit work bulk``
(the same query model as ``GET /v1/work`` and the console's filter form)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from conduit_core.cli._choices import LISTED_STATES

if TYPE_CHECKING:
    from conduit_core.http import WorkFilter

__all__ = ["FILTER_OPTION_NAMES", "filter_options", "work_filter"]

F = TypeVar("F", bound=Callable[..., Any])

#: The keyword arguments ``filter_options`` adds to a command.
FILTER_OPTION_NAMES = (
    "work_id", "id_prefix", "binding", "status", "scope", "since", "until", "input_filter", "order",
)  # fmt: skip

_OPTIONS = (
    click.option("--id", "work_id", help="Exactly this Work id."),
    click.option("--id-prefix", help="Ids starting with this."),
    click.option("--binding", help="Only Work of this binding."),
    click.option("--status", type=click.Choice(LISTED_STATES),
                 help="Only Work in this state (exhausted: ready, blocked until a retry)."),
    click.option("--scope", help="Only Work in this scope."),
    click.option("--since",
                 help="Created at or after: ISO-8601 with an offset, or -1h, -30m, -2d."),
    click.option("--until", help="Created before (as --since)."),
    click.option("--input", "input_filter", metavar="KEY=VALUE",
                 help="The first input's top-level KEY equals VALUE (as text)."),
    click.option("--order", type=click.Choice(("newest", "oldest")), default="newest",
                 show_default=True),
)  # fmt: skip


def filter_options(fn: F) -> F:
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


def work_filter(kwargs: dict[str, Any]) -> WorkFilter:
    """The filter the options gave (popped from ``kwargs``)."""
    from conduit_core.http import WorkFilter

    values = {name: kwargs.pop(name) for name in FILTER_OPTION_NAMES}
    return WorkFilter(
        id=values["work_id"], id_prefix=values["id_prefix"], binding=values["binding"],
        status=values["status"], scope=values["scope"], since=values["since"],
        until=values["until"], input=values["input_filter"], order=values["order"],
    )  # fmt: skip
