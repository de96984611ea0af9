"""Finding a launch again without recovery metadata, from the launch intent alone (generation 3).

The intent names the workspace and the marker every process of the launch carries. What exists
for them decides the outcome, and only proof counts:

- an exit status in the workspace → the job finished: read its result (never run it again);
  likewise the wrapper's record that it started too late to start the job (timed out, nothing
  ran);
- a launch holding the workspace's launch lock → it may still start the job: cannot tell (held);
- a live process carrying the marker that leads its own session → the wrapper: adopt it;
- the wrapper's ``wrapper.pid`` exists, but no process carries the marker and no status was
  recorded → the job started and is gone without a result (``ResourcesGoneError``);
- no ``wrapper.pid``, no process, no status → the job never started (``NotStartedError``): the
  wrapper writes its pid before it starts the job, and every process of it carries the marker;
- processes carrying the marker but no wrapper → cannot tell: ``OperationError`` (held).

The status is read again after the process scan, so a job that ends between the two looks is
read as finished rather than as gone. The scan is one of the executor's ``ProcessCensus``: the
recoveries in flight share one walk of the process table.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import anyio.to_thread
import psutil

from conduit_core.extension import NotStartedError, OperationError, ResourcesGoneError
from conduit_executors_shell._census import ProcessCensus, ProcessQuery
from conduit_executors_shell._launch_lock import held_by_a_launch
from conduit_executors_shell._metadata import JobRecord, LaunchIntent
from conduit_executors_shell._processes import find_wrapper
from conduit_executors_shell._workspace import Workspace

__all__ = ["check_recorded_job", "discover"]

# A create time no process has: a record of a finished job names no live wrapper to trust.
_NO_PROCESS_CREATE_TIME = 0.0


async def discover(intent: LaunchIntent, census: ProcessCensus) -> JobRecord:
    """The job the intent names, running or finished; raise when it never started or is gone."""
    workspace = Workspace(Path(intent.workspace))
    finished = await anyio.to_thread.run_sync(_finished_unless_launching, intent, workspace)
    if finished is not None:
        return finished
    marked = await census.processes(ProcessQuery.marked(intent.marker))
    return await anyio.to_thread.run_sync(_judge_marked, intent, workspace, marked)


def _finished_unless_launching(intent: LaunchIntent, workspace: Workspace) -> JobRecord | None:
    if _ended(workspace):
        return _finished(intent, workspace)
    if held_by_a_launch(workspace.path):
        raise OperationError(
            "launch_in_progress",
            f"a launch still holds {intent.workspace}/launch.lock (a paused host?) and may start "
            "the job: recovery is asked again later",
        )
    return None


def _judge_marked(
    intent: LaunchIntent, workspace: Workspace, marked: list[psutil.Process]
) -> JobRecord:
    # Read after the scan: a pid file missing now was missing during the scan, when the job
    # had not been started yet and the wrapper was the only process carrying the marker.
    wrapper = _wrapper_among(marked, intent, _wrapper_pid(workspace))
    if wrapper is not None:
        return wrapper
    if _ended(workspace):  # it ended between the two looks
        return _finished(intent, workspace)
    if marked:
        pids = ", ".join(str(p.pid) for p in marked)
        raise OperationError(
            "recovery_ambiguous",
            f"processes carrying launch marker {intent.marker!r} run ({pids}) but the job's "
            "wrapper is gone and no exit status was recorded",
        )
    started = _wrapper_pid(workspace)
    if started is not None:
        raise ResourcesGoneError(
            f"the job's wrapper (pid {started}) started, but no process carries launch marker "
            f"{intent.marker!r} and no exit status was recorded"
        )
    raise NotStartedError(
        f"nothing exists for launch marker {intent.marker!r}: no wrapper pid file, no process "
        "and no exit status"
    )


async def check_recorded_job(
    record: JobRecord, workspace: Workspace, census: ProcessCensus
) -> None:
    """A job with recovery metadata (generation 3): running or finished, else gone or unclear."""
    if await anyio.to_thread.run_sync(_ended_or_running, record, workspace):
        return
    marked: list[psutil.Process] = []
    if record.marker is not None:
        marked = await census.processes(ProcessQuery.marked(record.marker))
    if marked:
        raise OperationError(
            "recovery_ambiguous",
            f"the job's wrapper (pid {record.pid}) is gone without an exit status, but "
            f"{len(marked)} process(es) carrying its launch marker still run",
        )
    raise ResourcesGoneError(
        f"the job's wrapper (pid {record.pid}) is gone, no process carries its launch marker "
        "and no exit status was recorded"
    )


def _ended_or_running(record: JobRecord, workspace: Workspace) -> bool:
    if _ended(workspace) or find_wrapper(record) is not None:
        return True
    # The wrapper may have recorded its status and exited between the two looks.
    return _ended(workspace)


def _ended(workspace: Workspace) -> bool:
    try:
        return workspace.ended()
    except FileNotFoundError:
        return False


def _wrapper_pid(workspace: Workspace) -> int | None:
    """The pid the wrapper wrote before it started the job; 0 when the write was cut short."""
    try:
        text = workspace.wrapper_pid.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else 0


def _wrapper_among(
    marked: list[psutil.Process], intent: LaunchIntent, recorded_pid: int | None
) -> JobRecord | None:
    for process in marked:
        if recorded_pid is not None and process.pid != recorded_pid:
            continue  # a job's child may lead a session of its own; the wrapper wrote its pid
        try:
            # The wrapper leads the job's session (setsid).
            if os.getsid(process.pid) != process.pid:
                continue
            create_time = process.create_time()
        except (psutil.Error, ProcessLookupError):
            continue
        return JobRecord(
            pid=process.pid,
            pgid=process.pid,
            create_time=create_time,
            workspace=intent.workspace,
            launched_at=create_time,
            marker=intent.marker,
        )
    return None


def _finished(intent: LaunchIntent, workspace: Workspace) -> JobRecord:
    pid = _wrapper_pid(workspace) or 0
    try:
        launched_at = workspace.wrapper_pid.stat().st_mtime
    except FileNotFoundError:
        launched_at = workspace.path.stat().st_mtime
    return JobRecord(
        pid=pid,
        pgid=pid,
        create_time=_NO_PROCESS_CREATE_TIME,
        workspace=intent.workspace,
        launched_at=launched_at,
        marker=intent.marker,
    )
