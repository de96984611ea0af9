"""Turning a finished job into a :class:`Result`: its exit status or the typed result it wrote."""

from __future__ import annotations

import msgspec

from conduit_core.extension import (
    Artifact,
    OperationError,
    OutcomeKind,
    Result,
    Usage,
    validate_result,
)
from conduit_executors_shell._workspace import Workspace

__all__ = ["MAX_RESULT_FILE_BYTES", "USAGE_UNIT", "job_result", "timeout_result"]

#: A result file larger than this is refused as invalid rather than read into memory.
MAX_RESULT_FILE_BYTES = 1024 * 1024
#: The usage unit the shell executor reports: the job's wall time.
USAGE_UNIT = "minutes"

_result_decoder = msgspec.json.Decoder(Result)


def job_result(workspace: Workspace, exit_status: int, *, wall_minutes: float) -> Result:
    """The job's result: its typed result file when it wrote one, else its exit status."""
    artifacts = [
        Artifact(name="stdout", ref=str(workspace.stdout), media_type="text/plain"),
        Artifact(name="stderr", ref=str(workspace.stderr), media_type="text/plain"),
    ]
    usage = Usage(units={USAGE_UNIT: wall_minutes})
    try:
        written = _read_result_file(workspace)
    except OperationError as exc:
        return Result(
            outcome=OutcomeKind.FAILED,
            summary=f"{exc.code}: {exc.message} (exit status {exit_status})",
            usage=usage,
            artifacts=artifacts,
            data={"exit_status": exit_status, "code": exc.code},
        )
    if written is None:
        completed = exit_status == 0
        return Result(
            outcome=OutcomeKind.COMPLETED if completed else OutcomeKind.FAILED,
            summary=f"exit status {exit_status}",
            usage=usage,
            artifacts=artifacts,
            data={"exit_status": exit_status},
        )
    # The job's own usage units count as well; the wall time is ours to report.
    units = {**written.usage.units, USAGE_UNIT: wall_minutes}
    return msgspec.structs.replace(
        written,
        usage=msgspec.structs.replace(written.usage, units=units),
        artifacts=[*written.artifacts, *artifacts],
        data={**written.data, "exit_status": exit_status},
    )


def timeout_result(seconds: float, stop_detail: str, *, wall_minutes: float) -> Result:
    return Result(
        outcome=OutcomeKind.FAILED,
        summary=f"timeout: the job ran past its deadline ({seconds:.3g} s) and was stopped",
        usage=Usage(units={USAGE_UNIT: wall_minutes}),
        data={"code": "timeout", "stop": stop_detail},
    )


def _read_result_file(workspace: Workspace) -> Result | None:
    try:
        with workspace.result.open("rb") as source:
            raw = source.read(MAX_RESULT_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OperationError("invalid_result", f"result file unreadable: {exc.strerror}") from exc
    if len(raw) > MAX_RESULT_FILE_BYTES:
        raise OperationError(
            "invalid_result", f"result file is larger than {MAX_RESULT_FILE_BYTES} bytes"
        )
    try:
        result = _result_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise OperationError("invalid_result", f"result file: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise OperationError("invalid_result", f"result file is not JSON: {exc}") from exc
    validate_result(result)
    if result.outcome is OutcomeKind.WAITING:
        # Waiting parks the attempt for a resume, which a shell job cannot do.
        raise OperationError("invalid_result", "$.outcome: a shell job cannot wait (no resume)")
    return result
