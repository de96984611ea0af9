"""``conduit routines …``: add, list, pause, resume, run, remove Routines and show their history.

Commands act on the store named by the config (``settings.store``) directly, through the same
:class:`~conduit_core.routines.ConduitRoutineSource` the daemon serves. A daemon sharing the store
picks the write up at its next rescan (at most 60 s; daemons on PostgreSQL are woken at once).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from conduit_core.cli._choices import MISFIRE_POLICIES, WORK_KINDS
from conduit_core.cli._context import (
    config_option,
    json_option,
    load,
    parse_json_option,
    print_json,
    run,
)

if TYPE_CHECKING:
    from conduit_core.model import Routine
    from conduit_core.routines import ConduitRoutineSource, RoutineRun

__all__ = ["routines_group"]

T = TypeVar("T")


@asynccontextmanager
async def _source(
    config_path: Path | None, *, wake: bool = False
) -> AsyncIterator[ConduitRoutineSource]:
    import anyio.to_thread

    from conduit_core.daemon import is_postgres, notify_sync
    from conduit_core.routines import ConduitRoutineSource
    from conduit_core.runtime import SystemClock
    from conduit_core.storage import open_store

    config, paths = load(config_path)
    async with await open_store(paths.store) as store:
        yield ConduitRoutineSource(
            store,
            SystemClock(),
            bindings={name: b.scope for name, b in config.bindings.items()},
            scopes=set(config.scopes),
        )
    if wake and is_postgres(paths.store):
        try:
            await anyio.to_thread.run_sync(notify_sync, paths.store)
        except Exception as exc:  # the daemons' rescan finds the write anyway
            click.echo(f"note: could not wake the daemons ({type(exc).__name__})", err=True)


def _with_source(
    config_path: Path | None,
    action: Callable[[ConduitRoutineSource], Awaitable[T]],
    *,
    wake: bool = False,
) -> T:
    async def go() -> T:
        async with _source(config_path, wake=wake) as source:
            return await action(source)

    return run(go)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        # A value stored before once@ instants were bounded (year 10000 and on): show it raw
        # rather than fail the whole listing.
        return f"{ms}ms(out-of-range)"
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _line(routine: Routine) -> str:
    from conduit_core.routines import routine_record

    record = routine_record(routine)
    error = f"  error: {routine.last_error}" if routine.last_error else ""
    origin = " (config)" if routine.from_config else ""
    return (
        f"{routine.id}{origin}  {routine.status}  "
        f"spec={routine.cron_spec!r} tz={routine.timezone}  "
        f"next={_when(routine.next_run_at_ms)}  last={_when(routine.last_run_at_ms)}  "
        f"{record.target}{error}"
    )


def _show(routine: Routine, as_json: bool) -> None:
    if as_json:
        print_json(routine)
    else:
        click.echo(_line(routine))


@click.group("routines")
def routines_group() -> None:
    """Cron Routines: each fire creates Work (or input for a bound Work)."""


@routines_group.command("add")
@click.argument("routine_id")
@click.option("--cron", "spec", required=True, help="5/6-field cron (seconds first) or once@<ISO>.")
@click.option("--binding", help="Each fire creates Work on this binding.")
@click.option(
    "--work", "work_id", help="Instead, deliver input to this existing Work (once@ only)."
)
@click.option("--scope", help="The Work's scope (default: the binding's).")
@click.option("--timezone", default="UTC", show_default=True, help="IANA zone of the cron fields.")
@click.option("--kind", type=click.Choice(WORK_KINDS), default="task")
@click.option("--input", "input_json", help="The fire's input payload, as JSON.")
@click.option("--misfire", type=click.Choice(MISFIRE_POLICIES), default="coalesce")
@click.option("--grace-seconds", type=float, default=60.0, show_default=True)
@config_option
@json_option
def add(
    routine_id: str,
    spec: str,
    binding: str | None,
    work_id: str | None,
    scope: str | None,
    timezone: str,
    kind: str,
    input_json: str | None,
    misfire: str,
    grace_seconds: float,
    config_path: Path | None,
    as_json: bool,
) -> None:
    """Add Routine ROUTINE_ID (refused, and nothing stored, on any bad input)."""
    from conduit_core.model import MisfirePolicy, WorkKind, WorkTemplate
    from conduit_core.routines import ScheduleCreate

    request = ScheduleCreate(
        id=routine_id,
        spec=spec,
        timezone=timezone,
        scope=scope,
        target=WorkTemplate(
            binding=binding,
            scope=scope,
            kind=WorkKind(kind),
            input=parse_json_option(input_json, "--input"),
            work_id=work_id,
        ),
        misfire=MisfirePolicy(misfire),
        grace_seconds=grace_seconds,
    )
    _show(_with_source(config_path, lambda s: s.add(request), wake=True), as_json)


@routines_group.command("list")
@config_option
@json_option
def list_routines(config_path: Path | None, as_json: bool) -> None:
    """List every Routine with its status and next run."""
    routines = _with_source(config_path, lambda s: s.store.list_routines())
    if as_json:
        print_json(routines)
        return
    if not routines:
        click.echo("no routines")
    for routine in routines:
        click.echo(_line(routine))


def _change_command(action: str, summary: str) -> None:
    @routines_group.command(action, help=summary)
    @click.argument("routine_id")
    @config_option
    @json_option
    def command(routine_id: str, config_path: Path | None, as_json: bool) -> None:
        from conduit_core.routines import ScheduleChange

        change = ScheduleChange(action=action)  # type: ignore[arg-type]
        _show(_with_source(config_path, lambda s: s.update(routine_id, change), wake=True), as_json)


_change_command("pause", "Pause ROUTINE_ID: it never fires until resumed (refused mid-fire).")
_change_command("resume", "Resume ROUTINE_ID (paused or halted by an error), re-armed from now.")
_change_command("run", "Fire ROUTINE_ID now (an idle Routine is armed at this instant).")


@routines_group.command("remove")
@click.argument("routine_id")
@config_option
@json_option
def remove(routine_id: str, config_path: Path | None, as_json: bool) -> None:
    """Remove ROUTINE_ID (its fired Work is left alone)."""
    _with_source(config_path, lambda s: s.delete(routine_id), wake=True)
    if as_json:
        print_json({"id": routine_id, "removed": True})
    else:
        click.echo(f"removed {routine_id}")


@routines_group.command("history")
@click.argument("routine_id")
@click.option("--limit", type=int, default=20, show_default=True)
@config_option
@json_option
def history(routine_id: str, limit: int, config_path: Path | None, as_json: bool) -> None:
    """The fires of ROUTINE_ID, newest first."""
    runs: list[RoutineRun] = _with_source(config_path, lambda s: s.history(routine_id, limit=limit))
    if as_json:
        print_json(runs)
        return
    if not runs:
        click.echo("no fires yet")
    for fire in runs:
        error = f"  {fire.error}" if fire.error else ""
        click.echo(
            f"{_when(fire.scheduled_for_ms)}  {fire.outcome}  work={fire.work_id or '-'}"
            f"  ended={_when(fire.ended_at_ms)}{error}"
        )
