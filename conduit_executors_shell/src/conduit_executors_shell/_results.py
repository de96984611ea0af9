"""Turning a finished job into a :class:`Result`: its exit status or the typed result it wrote.

The reading and validation are the core's (``conduit_core.extension.job_result``), shared with
every job executor; this module adds the shell job's own artifacts.
"""

from __future__ import annotations

from conduit_core.extension import (
    MAX_RESULT_FILE_BYTES,
    WALL_TIME_UNIT,
    Artifact,
    OutcomeKind,
    Result,
    Usage,
    job_timeout_result,
)
from conduit_core.extension import (
    job_result as core_job_result,
)
from conduit_executors_shell._workspace import Workspace

__all__ = [
    "MAX_RESULT_FILE_BYTES",
    "USAGE_UNIT",
    "job_result",
    "late_start_result",
    "timeout_result",
]

#: The usage unit the shell executor reports: the job's wall time.
USAGE_UNIT = WALL_TIME_UNIT


def job_result(workspace: Workspace, exit_status: int, *, wall_minutes: float) -> Result:
    """The job's result: its typed result file when it wrote one, else its exit status."""
    artifacts = [
        Artifact(name="stdout", ref=str(workspace.stdout), media_type="text/plain"),
        Artifact(name="stderr", ref=str(workspace.stderr), media_type="text/plain"),
    ]
    return core_job_result(
        workspace.result, exit_status, wall_minutes=wall_minutes, artifacts=artifacts
    )


def timeout_result(seconds: float, stop_detail: str, *, wall_minutes: float) -> Result:
    return job_timeout_result("job", seconds, stop_detail, wall_minutes=wall_minutes)


def late_start_result() -> Result:
    """The wrapper found the attempt's deadline passed before it could start the job: timed
    out (code ``timeout``, retried as any timeout), and nothing ran."""
    return Result(
        outcome=OutcomeKind.FAILED,
        summary="timeout: the attempt's deadline passed before its job could start; nothing ran",
        usage=Usage(units={WALL_TIME_UNIT: 0.0}),
        data={"code": "timeout", "started": False},
    )
