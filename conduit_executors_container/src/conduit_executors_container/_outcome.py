"""A finished container's outcome, made durable on this host before the container is removed.

The handle writes it (temp file, fsync, rename) once it has read the exit status, the engine's
wall time and the output tails, and only then removes the container. A recovery that finds it
returns the same Result without the container, so a daemon killed between the removal and the
core's settle write is adopted, not held.

It lives beside the result directory (``epoch-1.outcome.json`` next to ``epoch-1/``), not in it:
the result directory is mounted into the container, and a job must not forge its own outcome.
It embeds the container's recovery record, so it is taken only for the container it names.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Literal

import msgspec

from conduit_core.extension import OperationError, Result
from conduit_executors_container._metadata import ContainerRecord
from conduit_executors_container._results import (
    OUTCOME_SUFFIX,
    container_result,
    timeout_result,
)

__all__ = ["RecordedOutcome", "outcome_path", "read_outcome", "write_outcome"]

class RecordedOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What the first observation of the container's end read from the engine."""

    layout: Literal["container-outcome/1"] = "container-outcome/1"
    record: ContainerRecord
    kind: Literal["exited", "timeout"]
    wall_minutes: float
    exit_status: int = -1
    logs_cut: list[str] = []
    # For a timeout: the seconds it was allowed and how it was stopped.
    allowed_seconds: float = 0.0
    stop_detail: str = ""

    def result(self) -> Result:
        """The Result, rebuilt from this record and the files kept in the result directory."""
        if self.kind == "timeout":
            return timeout_result(
                self.allowed_seconds, self.stop_detail, wall_minutes=self.wall_minutes
            )
        return container_result(
            Path(self.record.result_dir),
            self.exit_status,
            wall_minutes=self.wall_minutes,
            cut=self.logs_cut,
        )


def outcome_path(result_dir: str | Path) -> Path:
    path = Path(result_dir)
    return path.with_name(path.name + OUTCOME_SUFFIX)


def write_outcome(outcome: RecordedOutcome) -> None:
    """Durably record ``outcome`` (blocking): a reader sees all of it or none."""
    final = outcome_path(outcome.record.result_dir)
    partial: str | None = None
    try:
        # A name of its own: two observers of one container (a fenced-out daemon's handle and
        # its successor's) may record at once; each renames a whole file, both the same end.
        fd, partial = tempfile.mkstemp(prefix=final.name + ".", suffix=".partial", dir=final.parent)
        with os.fdopen(fd, "wb") as out:
            out.write(msgspec.json.encode(outcome))
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, final)
        partial = None
        _fsync_dir(final.parent)
    except OSError as exc:
        if partial is not None:
            with contextlib.suppress(OSError):
                os.unlink(partial)
        # Not recorded: the container is kept, so a recovery still reads it from the engine.
        raise OperationError(
            "outcome_unrecorded",
            f"the outcome of container {outcome.record.name!r} could not be recorded at "
            f"{str(final)!r}: {exc.strerror or exc}",
        ) from exc


def read_outcome(
    result_dir: str, *, container_id: str | None = None, name: str | None = None
) -> RecordedOutcome | None:
    """The outcome recorded for the container with this id (or, without one, this name).

    ``None`` when none is recorded, or the record is another container's.
    """
    path = outcome_path(result_dir)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OperationError(
            "recovery_unprovable",
            f"the recorded outcome at {str(path)!r} cannot be read: {exc.strerror or exc}",
        ) from exc
    try:
        outcome = msgspec.json.decode(raw, type=RecordedOutcome)
    except msgspec.DecodeError as exc:
        # It may be this container's: neither trusted nor ignored.
        raise OperationError(
            "recovery_unprovable", f"the recorded outcome at {str(path)!r} is unreadable: {exc}"
        ) from exc
    if container_id is not None and outcome.record.container_id != container_id:
        return None
    if name is not None and outcome.record.name != name:
        return None
    if str(Path(outcome.record.result_dir)) != str(Path(result_dir)):
        return None  # copied from elsewhere: it does not describe this directory's files
    return outcome


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
