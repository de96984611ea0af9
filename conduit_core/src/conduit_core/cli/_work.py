"""``conduit work …`` and ``conduit capacity``: clients of the daemon (or of the store alone)."""

from __future__ import annotations

import getpass
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from conduit_core.cli._bulk_actions import bulk_group
from conduit_core.cli._choices import WORK_KINDS
from conduit_core.cli._context import (
    Api,
    call,
    config_option,
    json_option,
    no_daemon_note,
    open_api,
    parse_json_option,
    print_json,
    run,
)
from conduit_core.cli._filters import filter_options, work_filter
from conduit_core.errors import ConduitError

if TYPE_CHECKING:
    from conduit_core.http import DebounceRequest, HistoryPage, WorkDetail

__all__ = ["capacity_command", "work_group"]

#: ``watch`` exits with this status when the Work ends other than completed.
EXIT_NOT_COMPLETED = 1


@click.group("work")
def work_group() -> None:
    """Submit, inspect and control Work."""


@work_group.command("submit")
@click.argument("binding", required=False)
@click.option("--input", "input_json", help="The first input's payload, as JSON.")
@click.option("--scope", help="Run in this scope (default: the binding's).")
@click.option("--kind", type=click.Choice(WORK_KINDS), help="Default: task.")
@click.option("--id", "work_id", help="The Work id (default: generated, time-ordered).")
@click.option(
    "--priority",
    type=click.IntRange(-10, 10),
    help="Claim order, -10 to 10, higher first; each point counts as a minute of waiting "
    "(default: the binding's priority).",
)
@click.option(
    "--after",
    "after",
    multiple=True,
    help="Start only after this Work completed (repeatable; see docs/dependencies.md).",
)
@click.option(
    "--on-dependency-failure",
    type=click.Choice(("cancel", "hold", "run")),
    help="When a dependency fails or is cancelled: cancel this too (default), hold it for a "
    "person, or run it anyway.",
)
@click.option("--watch", "watch_after", is_flag=True, help="Then watch it until it ends.")
@click.option(
    "--dedup-key",
    help="Return the Work already submitted with this key instead of a new one (docs/dedup.md).",
)
@click.option(
    "--dedup",
    "dedup_scope",
    type=click.Choice(["queued", "active"]),
    help="How long the key names its Work: until it starts (queued, default) or ends (active).",
)
@click.option("--dedup-window", help="Instead of --dedup: any Work with the key created within "
              "this span (500ms, 5s, 10m, 2h, 1d).")  # fmt: skip
@click.option("--debounce-key", help="Collapse submits with this key into one pending Work.")
@click.option("--quiet", help="With --debounce-key: start this long after the last submit.")
@click.option("--max-wait", help="With --debounce-key: never later than this after the first.")
@click.option(
    "--from",
    "from_file",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    help="Submit one Work per line of this JSON Lines file (each line a submit body: binding, "
    "input, scope, kind, id, priority; `-` reads stdin). A bad line submits nothing.",
)
@config_option
@json_option
def submit(
    binding: str | None,
    input_json: str | None,
    scope: str | None,
    kind: str | None,
    work_id: str | None,
    priority: int | None,
    after: tuple[str, ...],
    on_dependency_failure: str | None,
    watch_after: bool,
    dedup_key: str | None,
    dedup_scope: str | None,
    dedup_window: str | None,
    debounce_key: str | None,
    quiet: str | None,
    max_wait: str | None,
    from_file: Path | None,
    config_path: Path | None,
    as_json: bool,
) -> None:
    """Create Work for BINDING with its first input (or many with --from FILE.jsonl).

    With a dedup or debounce key, a duplicate submit prints the Work it joined
    ("deduplicated: …") and exits 0."""
    if from_file is not None:
        given = [name for name, value in (
            ("BINDING", binding), ("--input", input_json), ("--scope", scope), ("--kind", kind),
            ("--id", work_id), ("--priority", priority is not None), ("--after", after),
            ("--on-dependency-failure", on_dependency_failure), ("--watch", watch_after),
            ("--dedup-key", dedup_key), ("--dedup", dedup_scope), ("--dedup-window", dedup_window),
            ("--debounce-key", debounce_key), ("--quiet", quiet), ("--max-wait", max_wait),
        ) if value]  # fmt: skip
        if given:
            raise click.UsageError(
                f"--from takes every Work from the file; {', '.join(given)} go in its lines"
            )
        from conduit_core.cli._bulk import submit_from_file

        submit_from_file(from_file, config_path, as_json)
        return
    if binding is None:
        raise click.UsageError("give BINDING (or --from FILE.jsonl)")
    from conduit_core.cli._render import console
    from conduit_core.http import SubmitRequest
    from conduit_core.model import DependencyFailure, WorkKind

    req = SubmitRequest(
        binding=binding,
        scope=scope,
        kind=WorkKind(kind or "task"),
        input=parse_json_option(input_json, "--input"),
        id=work_id,
        priority=priority,
        after=list(after),
        on_dependency_failure=(
            DependencyFailure(on_dependency_failure) if on_dependency_failure else None
        ),
        dedup_key=dedup_key,
        dedup=dedup_scope,  # type: ignore[arg-type]  # click checked the choice
        dedup_window=dedup_window,
        debounce=_debounce_option(debounce_key, quiet, max_wait),
    )

    async def go() -> WorkDetail:
        async with open_api(config_path) as api:
            return await api.submit(req)

    detail = run(go)
    if as_json and not watch_after:
        print_json(detail)
    elif not as_json and detail.deduplicated:
        console().print(f"deduplicated: {detail.work.id} (already submitted with this key)")
    elif not as_json:
        console().print(f"submitted {detail.work.id}")
    note = no_daemon_note(config_path)
    if note is not None and not watch_after:  # watch says it itself
        click.echo(note, err=True)
    if watch_after:
        _watch(detail.work.id, config_path, as_json, timeout=None)


def _debounce_option(
    key: str | None, quiet: str | None, max_wait: str | None
) -> DebounceRequest | None:
    from conduit_core.http import DebounceRequest

    if key is None:
        if quiet is not None or max_wait is not None:
            raise click.UsageError("--quiet and --max-wait go with --debounce-key")
        return None
    if quiet is None:
        raise click.UsageError("--debounce-key needs --quiet (how long after the last submit)")
    return DebounceRequest(key=key, quiet=quiet, max_wait=max_wait)


work_group.add_command(bulk_group)


@work_group.command("list")
@filter_options
@click.option("--limit", type=click.IntRange(1, 500), default=100, show_default=True)
@click.option("--after", help="The previous page's cursor (printed as `more: --after …`).")
@config_option
@json_option
def list_work(limit: int, after: str | None, config_path: Path | None, as_json: bool,
              **filters: Any) -> None:  # fmt: skip
    """Search Work, newest first (the filters of GET /v1/work and the console)."""
    from conduit_core.cli._render import console, work_table

    chosen = work_filter(filters)

    async def go(api: Api) -> object:
        return await api.list_work(chosen, limit=limit, after=after)

    page = call(config_path, go)
    if as_json:
        print_json(page)
        return
    from conduit_core.http import WorkPage

    assert isinstance(page, WorkPage)
    out = console()
    if not page.items:
        out.print("no work" + (" in the rows read so far" if page.partial else ""))
    else:
        out.print(work_table(page.items))
    if page.next:
        out.print(f"more: --after {page.next}", style="dim")


@work_group.command("show")
@click.argument("work_id")
@config_option
@json_option
def show(work_id: str, config_path: Path | None, as_json: bool) -> None:
    """Work with its attempts, segments and launch phases, holds and what it waits for."""
    from conduit_core.cli._render import console, work_detail

    async def go(api: Api) -> WorkDetail:
        return await api.show(work_id)

    detail = call(config_path, go)
    if as_json:
        print_json(detail)
    else:
        console().print(work_detail(detail))


@work_group.command("history")
@click.argument("work_id")
@click.option("--newest", is_flag=True, help="Newest first (default: oldest first).")
@click.option("--limit", type=click.IntRange(1, 500), default=100, show_default=True)
@click.option("--after", help="The previous page's `next`.")
@config_option
@json_option
def history(
    work_id: str, newest: bool, limit: int, after: str | None, config_path: Path | None,
    as_json: bool,
) -> None:  # fmt: skip
    """What happened to the Work: inputs, holds, gate decisions, attempts, controls (who, when)."""
    async def go() -> HistoryPage:
        async with open_api(config_path) as api:
            return await api.history(work_id, limit=limit, after=after, newest=newest)

    page = run(go)
    if as_json:
        print_json(page)
        return
    for e in page.items:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e.at_ms / 1000))
        line = f"{at}Z  {e.kind:<16} {e.summary}"
        if e.reason:
            line += f" — reason: {e.reason}"
        click.echo(f"{line}  [by {e.actor or '—'}]")
    if page.next:
        click.echo(f"more: --after {page.next}")


@work_group.command("watch")
@click.argument("work_id")
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds.")
@config_option
@json_option
def watch(work_id: str, timeout: float | None, config_path: Path | None, as_json: bool) -> None:
    """Follow Work until it completes, fails or is cancelled (exit 0 only when completed)."""
    _watch(work_id, config_path, as_json, timeout=timeout)


def _watch(work_id: str, config_path: Path | None, as_json: bool, *, timeout: float | None) -> None:
    import anyio
    from rich.live import Live

    from conduit_core.cli._render import console, status_line, work_detail
    from conduit_core.model import WorkStatus

    out = console()
    live_view = out.is_terminal and not as_json
    note = no_daemon_note(config_path)
    if note is not None:
        click.echo(note, err=True)

    async def go() -> WorkDetail:
        deadline = None if timeout is None else time.monotonic() + timeout
        last = ""
        async with open_api(config_path) as api:
            detail = await api.show(work_id)
            live = (
                Live(work_detail(detail), console=out, refresh_per_second=4) if live_view else None
            )
            try:
                if live is not None:
                    live.start()
                while True:
                    if live is not None:
                        live.update(work_detail(detail))
                    elif not as_json:
                        line = status_line(detail)
                        if line.plain != last:
                            out.print(line)
                            last = line.plain
                    if _settled(detail):
                        return detail
                    if deadline is not None and time.monotonic() > deadline:
                        raise ConduitError(
                            f"work {work_id!r} still {detail.work.status} after {timeout:g} s",
                            code="watch_timeout",
                        )
                    await anyio.sleep(0.25)
                    detail = await api.show(work_id)
            finally:
                if live is not None:
                    live.stop()

    detail = run(go)
    if as_json:
        print_json(detail)
    elif not live_view:
        # The last status line is printed already: add what it does not say.
        out.print(work_detail(detail, with_status=False))
    if detail.work.status is not WorkStatus.COMPLETED:
        sys.exit(EXIT_NOT_COMPLETED)


def _settled(detail: WorkDetail) -> bool:
    """Ended, or blocked until a person retries it (it will not move by itself)."""
    from conduit_core.model import WorkStatus

    work = detail.work
    blocked = work.status is WorkStatus.READY and work.blocked_reason and not work.retry_pending
    return work.status.terminal or bool(blocked)


@work_group.command("cancel")
@click.argument("work_id")
@click.option("--reason", default="")
@config_option
@json_option
def cancel(work_id: str, reason: str, config_path: Path | None, as_json: bool) -> None:
    """Cancel Work; a running attempt is stopped (verified) before its slot is freed."""
    from conduit_core.http import CancelRequest

    async def go() -> WorkDetail:
        async with open_api(config_path) as api:
            return await api.cancel(work_id, CancelRequest(reason=reason))

    _print_detail(run(go), as_json, "cancelled")


@work_group.command("retry")
@click.argument("work_id")
@click.option("--reason", default="")
@config_option
@json_option
def retry(work_id: str, reason: str, config_path: Path | None, as_json: bool) -> None:
    """Manual retry: reset the failure budget and run again now."""
    from conduit_core.http import RetryRequest

    async def go() -> WorkDetail:
        async with open_api(config_path) as api:
            return await api.retry(work_id, RetryRequest(reason=reason))

    _print_detail(run(go), as_json, "retry requested for")


@work_group.command("confirm-stopped")
@click.argument("work_id")
@click.option("--epoch", type=click.IntRange(min=1), required=True,
              help="The held attempt's epoch, as `conduit work show` reports it.")  # fmt: skip
@click.option("--reason", default="", help="Why you know it stopped (recorded in the audit).")
@config_option
@json_option
def confirm_stopped(
    work_id: str, epoch: int, reason: str, config_path: Path | None, as_json: bool
) -> None:
    """Confirm that the Work's held attempt no longer runs, so a new attempt may start.

    Refused for any other epoch than the attempt's; recorded as core.execution.stop_confirmed.
    """
    from conduit_core.http import ConfirmStoppedRequest

    req = ConfirmStoppedRequest(epoch=epoch, reason=reason, by=f"{getpass.getuser()} (cli)")

    async def go() -> WorkDetail:
        async with open_api(config_path) as api:
            return await api.confirm_stopped(work_id, req)

    _print_detail(run(go), as_json, "stop confirmed for")


@work_group.command("inject")
@click.argument("work_id")
@click.option("--payload", "payload_json", help="The input's payload, as JSON.")
@click.option("--type", "event_type", default="core.input", show_default=True)
@click.option("--queue", is_flag=True, help="Only queue it as the next attempt's input.")
@config_option
@json_option
def inject(
    work_id: str,
    payload_json: str | None,
    event_type: str,
    queue: bool,
    config_path: Path | None,
    as_json: bool,
) -> None:
    """Deliver input to the running attempt (queued for the next attempt if none runs)."""
    from conduit_core.cli._render import console
    from conduit_core.http import InputRequest

    req = InputRequest(payload=parse_json_option(payload_json, "--payload"), type=event_type)

    async def go() -> object:
        async with open_api(config_path) as api:
            if queue:
                return await api.send_input(work_id, req)
            return await api.inject(work_id, req)

    event = run(go)
    if as_json:
        print_json(event)
    else:
        console().print(f"input accepted for {work_id}")


@work_group.command("interrupt")
@click.argument("work_id")
@click.option("--reason", default="")
@config_option
@json_option
def interrupt(work_id: str, reason: str, config_path: Path | None, as_json: bool) -> None:
    """Interrupt the running attempt (delivered by the daemon as a control)."""
    from conduit_core.http import InterruptRequest

    async def go() -> WorkDetail:
        async with open_api(config_path) as api:
            return await api.interrupt(work_id, InterruptRequest(reason=reason))

    _print_detail(run(go), as_json, "interrupt requested for")


def _print_detail(detail: WorkDetail, as_json: bool, verb: str) -> None:
    from conduit_core.cli._render import console, status_line

    if as_json:
        print_json(detail)
    else:
        console().print(f"{verb} {detail.work.id}")
        console().print(status_line(detail))


@click.command("capacity")
@config_option
@json_option
def capacity_command(config_path: Path | None, as_json: bool) -> None:
    """Capacity per pool and scope: slots in use, limits, ready Work waiting."""
    from conduit_core.cli._render import capacity_table, console

    async def go() -> object:
        async with open_api(config_path) as api:
            return await api.capacity()

    view = run(go)
    if as_json:
        print_json(view)
        return
    from conduit_core.http import CapacityView

    assert isinstance(view, CapacityView)
    console().print(capacity_table(view))
    if view.waiting_at_ms is None:
        console().print("no daemon runs: waiting counts are unknown", style="dim")
