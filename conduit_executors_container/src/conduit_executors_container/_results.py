"""The result directory shared with the container, and turning a finished container into a Result.

Layout of the host directory mounted at ``/conduit``::

    input.jsonl     the pending input batch as JSON lines (``CONDUIT_INPUT``)
    result.json     where the job may write a typed result (``CONDUIT_RESULT``)
    stdout, stderr  the tail of the container's output, captured when it ends

and beside it, outside the mount, ``epoch-N.outcome.json``: the container's end as first
observed, recorded before the container is removed (see ``_outcome``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

from conduit_core.extension import (
    MAX_RESULT_FILE_BYTES,
    WALL_TIME_UNIT,
    Artifact,
    InputEvent,
    OperationError,
    Result,
    execution_dir_name,
    job_result,
    job_timeout_result,
)
from conduit_executors_container._config import RESULT_MOUNT

__all__ = [
    "MAX_RESULT_FILE_BYTES",
    "OUTCOME_SUFFIX",
    "USAGE_UNIT",
    "container_result",
    "create_result_dir",
    "job_variables_paths",
    "timeout_result",
]

#: The usage unit the container executor reports: the container's wall time.
USAGE_UNIT = WALL_TIME_UNIT
#: The recorded outcome (``_outcome``) of the result directory ``epoch-N`` is ``epoch-N`` + this,
#: beside it rather than in it: the job cannot write there.
OUTCOME_SUFFIX = ".outcome.json"
_event_encoder = msgspec.json.Encoder()


def result_root(state_dir: str | None) -> Path:
    if state_dir is not None:
        return Path(state_dir)  # the host's directory for this executor alone
    # Without a host-given directory the results live under the temp root, per user.
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"conduit-container-{os.getuid()}"


def create_result_dir(
    state_dir: str | None, execution_id: str, epoch: int, inputs: Sequence[InputEvent]
) -> Path:
    """Create the (execution, epoch) result directory, empty but for the input batch."""
    path = result_root(state_dir) / execution_dir_name(execution_id) / f"epoch-{epoch}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.mkdir(exist_ok=True)
        # The job may run as any user (``user``); its parents (0700) keep other host users out.
        path.chmod(0o777)
        for stale in ("result.json", "stdout", "stderr"):
            path.joinpath(stale).unlink(missing_ok=True)
        path.with_name(path.name + OUTCOME_SUFFIX).unlink(missing_ok=True)
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
    return job_result(
        result_dir / "result.json", exit_status, wall_minutes=wall_minutes, artifacts=artifacts,
        data={"logs_cut": list(cut)} if cut else None,
    )  # fmt: skip


def timeout_result(seconds: float, stop_detail: str, *, wall_minutes: float) -> Result:
    return job_timeout_result("container", seconds, stop_detail, wall_minutes=wall_minutes)
