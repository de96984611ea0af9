"""Results of process-like jobs: an exit status, or the typed result file the job wrote.

Executors that run a program (the shell and container executors, and third-party ones modelled
on them) give the job a path in ``CONDUIT_RESULT``. When the job writes a :class:`Result` there
as JSON it wins over the exit status; an invalid file fails the attempt with a message naming
the bad field (its ``$.path``), never a crash. The wall time is always reported as usage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from conduit_core.extension._results import (
    Artifact,
    OperationError,
    OutcomeKind,
    Result,
    Usage,
    validate_result,
)
from conduit_core.validation import InvalidValueError, decode_bounded

__all__ = [
    "MAX_RESULT_FILE_BYTES",
    "WALL_TIME_UNIT",
    "job_result",
    "job_timeout_result",
    "read_result_file",
]

#: A result file larger than this is refused as invalid rather than read into memory.
MAX_RESULT_FILE_BYTES = 1024 * 1024
#: The usage unit job executors report: the job's wall time in minutes.
WALL_TIME_UNIT = "minutes"

_result_decoder = msgspec.json.Decoder(Result)


def read_result_file(path: Path, *, can_wait: bool = False) -> Result | None:
    """The typed result at ``path``, ``None`` when there is none; ``invalid_result`` otherwise."""
    try:
        with path.open("rb") as source:
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
        result = decode_bounded(_result_decoder.decode, raw, field="result file")
    except InvalidValueError as exc:  # nested too deep: was a RecursionError (executor_error)
        raise OperationError("invalid_result", exc.message) from exc
    except msgspec.ValidationError as exc:
        raise OperationError("invalid_result", f"result file: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise OperationError("invalid_result", f"result file is not JSON: {exc}") from exc
    validate_result(result)
    if result.outcome is OutcomeKind.WAITING and not can_wait:
        # Waiting parks the attempt for a resume, which this executor cannot do.
        raise OperationError("invalid_result", "$.outcome: this job cannot wait (no resume)")
    return result


def job_result(
    result_file: Path,
    exit_status: int,
    *,
    wall_minutes: float,
    artifacts: Sequence[Artifact] = (),
    data: Mapping[str, Any] | None = None,
    can_wait: bool = False,
) -> Result:
    """The job's result: its typed result file when it wrote one, else its exit status."""
    usage = Usage(units={WALL_TIME_UNIT: wall_minutes})
    facts = {"exit_status": exit_status, **(data or {})}
    try:
        written = read_result_file(result_file, can_wait=can_wait)
    except OperationError as exc:
        return Result(
            outcome=OutcomeKind.FAILED,
            summary=f"{exc.code}: {exc.message} (exit status {exit_status})",
            usage=usage,
            artifacts=list(artifacts),
            data={**facts, "code": exc.code},
        )
    if written is None:
        return Result(
            outcome=OutcomeKind.COMPLETED if exit_status == 0 else OutcomeKind.FAILED,
            summary=f"exit status {exit_status}",
            usage=usage,
            artifacts=list(artifacts),
            data=facts,
        )
    # The job's own usage units count as well; the wall time is the executor's to report.
    units = {**written.usage.units, WALL_TIME_UNIT: wall_minutes}
    return msgspec.structs.replace(
        written,
        usage=msgspec.structs.replace(written.usage, units=units),
        artifacts=[*written.artifacts, *artifacts],
        data={**written.data, **facts},
    )


def job_timeout_result(
    what: str, seconds: float, stop_detail: str, *, wall_minutes: float
) -> Result:
    """A job stopped at its deadline: failed with code ``timeout``."""
    return Result(
        outcome=OutcomeKind.FAILED,
        summary=f"timeout: the {what} ran past its deadline ({seconds:.3g} s) and was stopped",
        usage=Usage(units={WALL_TIME_UNIT: wall_minutes}),
        data={"code": "timeout", "stop": stop_detail},
    )
