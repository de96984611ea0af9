"""The result directory shared with the container, and turning a finished container into a Result.

Layout of the host directory mounted at ``/conduit``::

    input.jsonl     the pending input batch as JSON lines (``CONDUIT_INPUT``)
    result.json     where the job may write a typed result (``CONDUIT_RESULT``)
    stdout, stderr  the tail of the container's output, captured when it ends
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

from conduit_core.extension import (
    Artifact,
    InputEvent,
    OperationError,
    OutcomeKind,
    Result,
    Usage,
    validate_result,
)
from conduit_executors_container._config import RESULT_MOUNT
from conduit_executors_container._engine import safe_id

__all__ = [
    "MAX_RESULT_FILE_BYTES",
    "USAGE_UNIT",
    "container_result",
    "create_result_dir",
    "job_variables_paths",
    "timeout_result",
]

#: A result file larger than this is refused as invalid rather than read into memory.
MAX_RESULT_FILE_BYTES = 1024 * 1024
#: The usage unit the container executor reports: the container's wall time.
USAGE_UNIT = "minutes"

_result_decoder = msgspec.json.Decoder(Result)
_event_encoder = msgspec.json.Encoder()


def result_root(state_dir: str | None) -> Path:
    if state_dir is not None:
        return Path(state_dir) / "container"
    # Without a host-given directory the results live under the temp root, per user.
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"conduit-container-{os.getuid()}"


def create_result_dir(
    state_dir: str | None, execution_id: str, epoch: int, inputs: Sequence[InputEvent]
) -> Path:
    """Create the (execution, epoch) result directory, empty but for the input batch."""
    path = result_root(state_dir) / safe_id(execution_id) / f"epoch-{epoch}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.mkdir(exist_ok=True)
        # The job may run as any user (``user``); its parents (0700) keep other host users out.
        path.chmod(0o777)
        for stale in ("result.json", "stdout", "stderr"):
            path.joinpath(stale).unlink(missing_ok=True)
        path.joinpath("input.jsonl").write_bytes(
            b"".join(_event_encoder.encode(event) + b"\n" for event in inputs)
        )
    except OSError as exc:
        raise OperationError(
            "invalid_config",
            f"container result directory {str(path)!r} is not usable: {exc.strerror or exc}",
            permanent=True,
        ) from exc
    return path


def job_variables_paths() -> dict[str, str]:
    return {
        "CONDUIT_RESULT": f"{RESULT_MOUNT}/result.json",
        "CONDUIT_INPUT": f"{RESULT_MOUNT}/input.jsonl",
    }


def container_result(
    result_dir: Path, exit_status: int, *, wall_minutes: float, cut: Sequence[str] = ()
) -> Result:
    """The job's result: its typed result file when it wrote one, else its exit status."""
    artifacts = [
        Artifact(name="stdout", ref=str(result_dir / "stdout"), media_type="text/plain"),
        Artifact(name="stderr", ref=str(result_dir / "stderr"), media_type="text/plain"),
    ]
    usage = Usage(units={USAGE_UNIT: wall_minutes})
    data: dict[str, object] = {"exit_status": exit_status}
    if cut:
        data["logs_cut"] = list(cut)
    try:
        written = _read_result_file(result_dir / "result.json")
    except OperationError as exc:
        return Result(
            outcome=OutcomeKind.FAILED,
            summary=f"{exc.code}: {exc.message} (exit status {exit_status})",
            usage=usage,
            artifacts=artifacts,
            data={**data, "code": exc.code},
        )
    if written is None:
        return Result(
            outcome=OutcomeKind.COMPLETED if exit_status == 0 else OutcomeKind.FAILED,
            summary=f"exit status {exit_status}",
            usage=usage,
            artifacts=artifacts,
            data=data,
        )
    # The job's own usage units count as well; the wall time is ours to report.
    units = {**written.usage.units, USAGE_UNIT: wall_minutes}
    return msgspec.structs.replace(
        written,
        usage=msgspec.structs.replace(written.usage, units=units),
        artifacts=[*written.artifacts, *artifacts],
        data={**written.data, **data},
    )


def timeout_result(seconds: float, stop_detail: str, *, wall_minutes: float) -> Result:
    return Result(
        outcome=OutcomeKind.FAILED,
        summary=f"timeout: the container ran past its deadline ({seconds:.3g} s) and was stopped",
        usage=Usage(units={USAGE_UNIT: wall_minutes}),
        data={"code": "timeout", "stop": stop_detail},
    )


def _read_result_file(path: Path) -> Result | None:
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
        result = _result_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise OperationError("invalid_result", f"result file: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise OperationError("invalid_result", f"result file is not JSON: {exc}") from exc
    validate_result(result)
    if result.outcome is OutcomeKind.WAITING:
        # Waiting parks the attempt for a resume, which a container job cannot do.
        raise OperationError("invalid_result", "$.outcome: a container job cannot wait (no resume)")
    return result
