"""``conduit work bulk cancel|retry|approve|refuse``: one action on many Work, by filter or ids.

The same operation as ``POST /v1/work/bulk/{action}`` (``http/_bulk``): each Work is acted on
alone and reported alone; ``--dry-run`` prints the count and the first ids and does nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from conduit_core.cli._context import Api, call, config_option, json_option, print_json
from conduit_core.cli._filters import filter_options, work_filter
from conduit_core.errors import ConduitError

__all__ = ["bulk_group"]

#: Exit status when at least one Work's action failed.
EXIT_SOME_FAILED = 1


@click.group("bulk")
def bulk_group() -> None:
    """Cancel, retry, approve or refuse many Work: every Work matching filters, or --ids."""


def _bulk_command(action: str) -> click.Command:
    @filter_options
    @click.option("--ids", help="Comma-separated Work ids (instead of the filters).")
    @click.option("--dry-run", is_flag=True, help="Print how many match and the first ids.")
    @click.option("--cap", type=click.IntRange(1, 10_000), default=1000, show_default=True,
                  help="Refuse (over_cap) if more Work than this match.")
    @click.option("--reason", default="", help="Why (recorded with each Work's action).")
    @config_option
    @json_option
    def command(ids: str | None, dry_run: bool, cap: int, reason: str,
                config_path: Path | None, as_json: bool, **filters: Any) -> None:  # fmt: skip
        from conduit_core.http import BulkRequest, BulkResult

        chosen = work_filter(filters)
        if ids is not None and not chosen.empty:
            raise ConduitError("give --ids or filters, not both", code="invalid_bulk")
        if ids is None and chosen.empty:
            raise ConduitError(
                "no filter: give at least one (--status, --binding, --since, …) or --ids",
                code="invalid_bulk",
            )  # fmt: skip
        req = BulkRequest(
            filter=None if ids is not None else chosen,
            ids=None if ids is None else [i.strip() for i in ids.split(",") if i.strip()],
            dry_run=dry_run, cap=cap, reason=reason,
        )  # fmt: skip

        async def go(api: Api) -> object:
            return await api.bulk(action, req)

        result = call(config_path, go)
        assert isinstance(result, BulkResult)
        if as_json:
            print_json(result)
        elif result.dry_run:
            shown = ", ".join(result.ids) + (" …" if result.matched > len(result.ids) else "")
            click.echo(f"{result.matched} Work would be {_done(action)}" +
                       (f": {shown}" if shown else ""))  # fmt: skip
        else:
            for item in result.results:
                if item.ok:
                    click.echo(f"{item.id}  {_done(action)} (now {item.status})")
                else:
                    click.echo(f"{item.id}  failed [{item.code}] {item.error}")
            click.echo(f"{result.succeeded} {_done(action)}, {result.failed} failed "
                       f"(of {result.matched})")  # fmt: skip
        if result.failed:
            raise SystemExit(EXIT_SOME_FAILED)

    command.__doc__ = f"{action.capitalize()} every Work matching the filters (or --ids)."
    return click.command(action)(command)


def _done(action: str) -> str:
    return {"cancel": "cancelled", "retry": "retried", "approve": "approved",
            "refuse": "refused"}[action]  # fmt: skip


for _action in ("cancel", "retry", "approve", "refuse"):
    bulk_group.add_command(_bulk_command(_action))
