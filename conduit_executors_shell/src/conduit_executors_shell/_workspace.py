"""The job's workspace: one directory per execution and epoch holding everything durable.

Layout (every name relative to the workspace)::

    input.jsonl          the pending input batch, then injected input, as JSON lines
    input.fifo           the job's stdin when it accepts injected input
    stdout, stderr       the job's output (the tail is kept past the binding's limits)
    result.json          where the job may write a typed result (``CONDUIT_RESULT``)
    wrapper.pid          written by the wrapper (its pid) before it starts the job (generation 3)
    exit-status.<N>      created, empty, by the wrapper when the job ends with status N
    not-started.past-deadline
                         created, empty, by a wrapper that started too late to start the job

The directory is ``<root>/<readable prefix>-<digest>/epoch-<N>`` (``execution_dir_name``): the
digest (sha256 of the execution id) makes the path injective, so two ids that sanitize alike
(``k:0`` and ``k_0``) never share a workspace; the prefix only helps a person find it.

The exit status lives in the *name* of an empty file because creating a name is atomic, and the
``/bin/sh`` wrapper has no rename built in; an external ``mv`` would cost a second process start
on every job.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from conduit_core.extension import OperationError, execution_dir_name

__all__ = [
    "EXIT_STATUS_PREFIX",
    "Workspace",
    "create_workspace",
    "read_tail",
    "workspace_path",
    "workspace_root",
]

EXIT_STATUS_PREFIX = "exit-status."
_EXIT_STATUS_NAME = re.compile(r"^exit-status\.(\d{1,3})$")


@dataclass(frozen=True)
class Workspace:
    path: Path

    @property
    def input(self) -> Path:
        return self.path / "input.jsonl"

    @property
    def input_fifo(self) -> Path:
        return self.path / "input.fifo"

    @property
    def stdout(self) -> Path:
        return self.path / "stdout"

    @property
    def stderr(self) -> Path:
        return self.path / "stderr"

    @property
    def result(self) -> Path:
        return self.path / "result.json"

    @property
    def wrapper_pid(self) -> Path:
        return self.path / "wrapper.pid"

    @property
    def not_started_past_deadline(self) -> Path:
        return self.path / "not-started.past-deadline"

    def ended(self) -> bool:
        """The wrapper is done with the job: an exit status, or it never started it (late)."""
        return self.not_started_past_deadline.exists() or self.recorded_exit_status() is not None

    def recorded_exit_status(self) -> int | None:
        """The exit status the wrapper recorded, or ``None`` while there is none."""
        with os.scandir(self.path) as entries:
            for entry in entries:
                match = _EXIT_STATUS_NAME.match(entry.name)
                if match:
                    return int(match.group(1))
        return None

    def exit_status_path(self, status: int) -> Path:
        """The file whose creation recorded ``status``; its mtime is when the job ended."""
        return self.path / f"{EXIT_STATUS_PREFIX}{status}"

    def keep_output_tail(self, stdout_limit: int, stderr_limit: int) -> list[str]:
        """Cut stdout/stderr to their last ``limit`` bytes; return the names that were cut."""
        cut = []
        for path, limit in ((self.stdout, stdout_limit), (self.stderr, stderr_limit)):
            if _keep_tail(path, limit):
                cut.append(path.name)
        return cut


def workspace_root(state_dir: str | None) -> Path:
    if state_dir is not None:
        return Path(state_dir)  # the host's directory for this executor alone
    # Without a host-given directory the jobs live under the temp root, per user.
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"conduit-shell-{os.getuid()}"


def workspace_path(state_dir: str | None, execution_id: str, epoch: int) -> Path:
    """The (execution, epoch) workspace directory: deterministic and injective in both."""
    return workspace_root(state_dir) / execution_dir_name(execution_id) / f"epoch-{epoch}"


def create_workspace(path: Path) -> Workspace:
    """Create the workspace at ``path``; a directory we cannot use is a permanent failure."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        # A leftover from an earlier launch at this epoch must not read as this job's status.
        for stale in path.glob(f"{EXIT_STATUS_PREFIX}*"):
            stale.unlink()
        path.joinpath("result.json").unlink(missing_ok=True)
        path.joinpath("wrapper.pid").unlink(missing_ok=True)
    except OSError as exc:
        raise OperationError(
            "invalid_config",
            f"shell workspace {str(path)!r} is not usable: {exc.strerror or exc}",
            permanent=True,
        ) from exc
    return Workspace(path)


def _keep_tail(path: Path, limit: int) -> bool:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size <= limit:
        return False
    with path.open("rb") as source:
        source.seek(size - limit)
        tail = source.read(limit)
    partial = path.with_name(path.name + ".tail")
    partial.write_bytes(tail)
    partial.replace(path)
    return True


def read_tail(path: Path, max_bytes: int) -> bytes | None:
    """The last ``max_bytes`` bytes of ``path`` (``None`` when it does not exist)."""
    try:
        with path.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size > max_bytes:
                file.seek(size - max_bytes)
            return file.read(max_bytes)
    except FileNotFoundError:
        return None
