"""Detached jobs found again by a marker: the crash-safe launch pattern, shared.

An executor whose jobs must outlive it (a daemon restart, or an out-of-process executor's own
restart) starts each job detached, with a per-launch marker in every process's environment and a
directory where the job's exit status appears atomically. Recovery then needs nothing but the
launch intent: a marked process is a running job, a status file a finished one, neither a job
that never started — unless a launch still holds the directory's launch lock (``launching``):
then an earlier launch, stalled between its last fenced write and its spawn (a paused host, a
program the daemon lost but that still runs), may yet start the job, and recovery cannot tell
(``launch_in_progress``). Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import anyio
import anyio.to_thread

from conduit_core.extension._executor import StopEvidence
from conduit_core.extension._results import OperationError

__all__ = ["DetachedJobs"]

# The wrapper runs in the background of a shell that exits at once, so the job is never the
# executor's child (nothing to reap) and outlives it; the status file appears atomically. The
# wrapper marks that it runs (``started``: it has been exec'd and stays until the status exists)
# and ends with a builtin so that no shell replaces it by its last command (``mv``): a process in
# the middle of an exec shows an empty environment, so the job would look gone for an instant.
_START = 'sh -c "$0" "$1" "$2" &'
_WRAPPER = (
    'cd "$0" && : >started && sh -c "$1" </dev/null >out 2>&1;'
    " echo $? >status.tmp; mv status.tmp status; exit 0"
)
#: How long a start waits for its job to show (a marked process or a status) before it gives up.
_VISIBLE_WITHIN = 30.0
#: A job found neither running nor finished is looked for again this often before it is gone.
_GONE_LOOKS = 3


class DetachedJobs:
    """Start, find and kill detached shell jobs marked through the variable ``marker_env``."""

    def __init__(self, marker_env: str) -> None:
        self.marker_env = marker_env

    def processes(self, prefix: str) -> list[int]:
        """Live (not zombie) processes whose marker starts with ``prefix``."""
        needle = f"{self.marker_env}={prefix}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            try:
                env = (proc / "environ").read_bytes().split(b"\0")
                state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z" and any(v.startswith(needle) for v in env):
                found.append(int(proc.name))
        return found

    @contextlib.asynccontextmanager
    async def launching(self, directory: Path) -> AsyncIterator[None]:
        """Hold ``directory``'s launch lock around the last fenced write before the start (the
        launch intent) and the start itself, so a recovery's look sees either the job or a
        launch still under way (``launch_in_progress``), never a gap a late spawn falls into."""
        path = _lock_path(directory)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            await anyio.to_thread.run_sync(fcntl.flock, fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    @staticmethod
    def launch_in_progress(directory: Path) -> bool:
        """Whether a launch (in any process) holds ``directory``'s launch lock now."""
        return lock_held(_lock_path(directory))

    async def start(
        self, directory: Path, command: str, marker: str, env: Mapping[str, str]
    ) -> None:
        """Start ``command`` (sh) detached in ``directory``; call after recording the intent,
        inside ``launching(directory)``.

        Returns once the wrapper runs (its ``started`` file, or the status): when the starting
        shell exits, the backgrounded wrapper may still be being exec'd, and a process mid-exec
        shows an empty environment. Returning earlier let a ``wait`` (or a recovery's look, once
        the launch lock is released) find nothing and call a running job vanished, which reran
        it (the chaos drill's wire duplicate). A job that never shows raises ``launch_unseen``.
        """
        full = {**env, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), self.marker_env: marker}
        argv = ["sh", "-c", _START, _WRAPPER, str(directory), command]

        def spawn() -> None:
            directory.mkdir(parents=True, exist_ok=True)
            subprocess.run(argv, env=full, start_new_session=True, check=True)

        await anyio.to_thread.run_sync(spawn)
        with anyio.move_on_after(_VISIBLE_WITHIN):
            while True:
                if (directory / "started").exists() or self.exit_status(directory) is not None:
                    return
                await anyio.sleep(0.005)
        raise OperationError(
            "launch_unseen",
            f"the job started in {directory} showed no process and no status within "
            f"{_VISIBLE_WITHIN:g} s",
        )

    @staticmethod
    def exit_status(directory: Path) -> int | None:
        """The finished job's exit status, ``None`` while there is none."""
        try:
            return int((directory / "status").read_text())
        except FileNotFoundError:
            return None

    async def wait(self, directory: Path, marker: str) -> int | None:
        """The exit status once the job ends; ``None`` when it vanished without one (found
        neither running nor finished ``_GONE_LOOKS`` times in a row, 50 ms apart: one empty
        look may be a process caught mid-exec)."""
        misses = 0
        while (status := self.exit_status(directory)) is None:
            if await anyio.to_thread.run_sync(self.processes, marker):
                misses = 0
            else:
                misses += 1
                if misses >= _GONE_LOOKS:
                    return self.exit_status(directory)  # it may have finished since the look
            await anyio.sleep(0.05)
        return status

    @staticmethod
    def output_tail(directory: Path, max_bytes: int) -> bytes:
        """The last ``max_bytes`` bytes the job wrote (stdout and stderr share the file ``out``);
        empty before it wrote anything."""
        try:
            with (directory / "out").open("rb") as out:
                size = out.seek(0, os.SEEK_END)
                out.seek(max(size - max_bytes, 0))
                return out.read(max_bytes)
        except FileNotFoundError:
            return b""

    def exists(self, directory: Path, marker: str) -> bool:
        """Anything of this launch: a marked process or its exit status."""
        return bool(self.processes(marker)) or self.exit_status(directory) is not None

    async def kill(self, prefix: str, within: float = 10.0) -> StopEvidence:
        """SIGKILL every process marked ``prefix…`` and prove none is left (``_GONE_LOOKS``
        empty looks in a row: a process caught mid-exec shows no marker for an instant)."""
        with anyio.move_on_after(within):
            misses = 0
            while misses < _GONE_LOOKS:
                pids = await anyio.to_thread.run_sync(self.processes, prefix)
                misses = 0 if pids else misses + 1
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                await anyio.sleep(0.05)
            return StopEvidence(verified=True, detail="no process carries the launch marker")
        return StopEvidence(
            verified=False, detail=f"marked processes survived SIGKILL for {within:g} s"
        )


def _lock_path(directory: Path) -> Path:
    return directory.with_name(f"{directory.name}.launch.lock")


def lock_held(path: Path) -> bool:
    """Whether a process holds an exclusive ``flock`` on ``path`` now (no file: none can).
    A launch holds its lock from its intent's write to its spawn; recovery asks this to tell a
    launch still under way from one that never started."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
