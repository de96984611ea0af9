"""Tables for people (rich). Scripts use ``--json`` instead."""

from __future__ import annotations

import sys
import time

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from conduit_core.http import CapacityView, DaemonView, WorkDetail, WorkView
from conduit_core.http.describe import (
    attempt_outcome,
    latest_artifacts,
    launch_trail,
    segment_marks,
    work_note,
)

__all__ = [
    "STATUS_STYLE",
    "capacity_table",
    "clock",
    "console",
    "daemons_table",
    "status_line",
    "work_detail",
    "work_table",
]

STATUS_STYLE = {
    "ready": "cyan",
    "running": "yellow",
    "launching": "yellow",
    "recovering": "magenta",
    "resuming": "yellow",
    "waiting": "blue",
    "parked": "blue",
    "held": "magenta",
    "completed": "green",
    "failed": "red",
    "exhausted": "red",
    "timed_out": "red",
    "handoff": "green",
    "cancelled": "dim",
    "draining": "yellow",
    "stopped": "dim",
    "lost": "red",
}


def console() -> Console:
    # Piped output (scripts, CI logs) is not wrapped at 80 columns. No markup: ids, reasons and
    # job output are printed as written (a Work id like ``a[b]`` is not a style); styles are given
    # as Text styles instead.
    return Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 200)


def clock(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000))


def _duration(start: int | None, end: int | None) -> str:
    if start is None:
        return "-"
    ms = (end if end is not None else int(time.time() * 1000)) - start
    return f"{ms / 1000:.1f}s" + ("" if end is not None else "…")


def _status(value: str) -> Text:
    return Text(value, style=STATUS_STYLE.get(value, ""))


def work_table(items: list[WorkView]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("ID", "STATUS", "BINDING", "SCOPE", "ATTEMPTS", "UPDATED", "NOTE"):
        table.add_column(column)
    for work in items:
        table.add_row(
            work.id,
            _status(work.state or str(work.status)),
            work.binding,
            work.scope,
            str(work.last_attempt),
            clock(work.updated_at_ms),
            work_note(work),
        )
    return table


def _attempts(detail: WorkDetail) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("#", "EPOCH", "STATUS", "EXECUTOR", "STARTED", "TOOK", "OUTCOME"):
        table.add_column(column)
    for attempt in detail.attempts:
        table.add_row(
            str(attempt.attempt),
            str(attempt.epoch),
            _status(str(attempt.status)),
            f"{attempt.executor}@{attempt.executor_generation}",
            clock(attempt.started_at_ms),
            _duration(attempt.started_at_ms, attempt.ended_at_ms),
            attempt_outcome(attempt),
        )
        for n, segment in enumerate(attempt.segments, start=1):
            phases = launch_trail(segment)
            table.add_row(
                "",
                str(segment.epoch),
                Text(f"segment {n}", style="dim"),
                " ".join(segment_marks(segment)),
                clock(segment.started_at_ms),
                _duration(segment.started_at_ms, segment.ended_at_ms),
                Text(phases, style="dim"),
            )
    return table


def status_line(detail: WorkDetail) -> Text:
    work = detail.work
    line = Text.assemble(
        (work.id, "bold"), "  ", _status(work.state or str(work.status)),
        f"  binding={work.binding} scope={work.scope} attempts={work.last_attempt}",
    )  # fmt: skip
    if work_note(work):
        line.append(f"  ({work_note(work)})", style="dim")
    if detail.waiting is not None:
        line.append(f"  waiting: {detail.waiting.message}", style="magenta")
    return line


def work_detail(detail: WorkDetail, *, with_status: bool = True) -> RenderableType:
    """The Work's status line (unless ``with_status`` is false), attempts, outputs and holds."""
    parts: list[RenderableType] = [status_line(detail)] if with_status else []
    if detail.attempts:
        parts.append(_attempts(detail))
    parts.extend(_outputs(detail))
    if detail.work.after:
        line = f"after: {', '.join(detail.work.after)}"
        line += f" (on failure: {detail.work.on_dependency_failure})"
        if detail.work.dependency_failed:
            line += f"; work {detail.work.dependency_failed} did not complete"
        parts.append(Text(line, style="dim"))
    for hold in detail.holds:
        parts.append(Text(f"hold: {hold.kind} by {hold.holder}: {hold.reason}", style="magenta"))
    for attempt in detail.attempts:
        if (held := attempt.recovery_hold) is not None:
            parts.append(
                Text(
                    f"recovery held: attempt {attempt.id} epoch {attempt.epoch} "
                    f"[{held.code}] {held.message}\n  settle: {held.settle}",
                    style="magenta",
                )
            )
    return Group(*parts)


def _outputs(detail: WorkDetail) -> list[Text]:
    """Where the latest finished attempt's artifacts are (a shell job's stdout and stderr)."""
    found = latest_artifacts(detail)
    if found is None:
        return []
    attempt, artifacts = found
    return [
        Text(f"{artifact.name}: {artifact.ref}  (attempt {attempt.attempt})", style="dim")
        for artifact in artifacts
    ]


def capacity_table(view: CapacityView) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("LIMIT", "IN USE", "MAX", "WAITING"):
        table.add_column(column)
    for pool in view.pools:
        table.add_row(f"pool {pool.name}", str(pool.in_use), _max(pool.limit), str(pool.waiting))
    for scope in view.scopes:
        table.add_row(
            f"scope {scope.name}", str(scope.in_use), _max(scope.limit), str(scope.waiting)
        )
    for key in view.keys:
        table.add_row(f"key {key.name}", str(key.in_use), str(key.limit), str(key.waiting))
    if view.keys_waiting > sum(key.waiting for key in view.keys):
        table.add_row("keys (all)", "", "", str(view.keys_waiting))
    return table


def _max(limit: int | None) -> str:
    return "-" if limit is None else str(limit)


def daemons_table(daemons: list[DaemonView]) -> Table | Text:
    if not daemons:
        return Text("no daemon has run on this store", style="dim")
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("DAEMON", "HOST", "PID", "LABELS", "STATE", "LOAD", "STARTED", "LAST SEEN"):
        table.add_column(column)
    for d in daemons:
        table.add_row(
            d.id, d.host, str(d.pid), ",".join(d.labels) or "-",
            Text(d.state, style=STATUS_STYLE.get(d.state, "")), str(d.load),
            clock(d.started_at_ms), clock(d.last_seen_ms),
        )  # fmt: skip
    return table
