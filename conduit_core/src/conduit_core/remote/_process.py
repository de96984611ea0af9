"""An executor program's process: started, watched and reaped by its supervisor alone.

The program's death is read from the process, never from its pipe: a program that forked a
child which keeps its stdout open (a ``setsid`` helper, a detached job that inherited it) still
ends its connection the moment it exits. Linux gives a pidfd, readable once the process exits,
so the event loop watches it and reaps exactly this pid (``Popen.poll``: ``waitpid(pid)``);
elsewhere one thread per program waits for it. asyncio's own subprocess machinery is not used:
its child watcher and its transport's ``close`` both call ``waitpid`` on the pid, and whichever
lost the race logged "Unknown child process pid N, will report returncode 255" and reported a
wrong status.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence

__all__ = ["ProgramProcess", "describe_exit"]


def describe_exit(returncode: int) -> str:
    """``exited with status 3`` / ``was killed by signal SIGKILL``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"was killed by signal {name}"
    return f"exited with status {returncode}"


class _WriteFlow(asyncio.Protocol):
    """The stdin pipe's flow control, as an event: cleared while the transport's buffer is
    above its high-water mark, set when it drains or the pipe is gone."""

    def __init__(self, writable: asyncio.Event) -> None:
        self._writable = writable

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()


class ProgramProcess:
    """One running program: its pipes as asyncio streams and ``exited`` (its return code)."""

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.loop = loop
        self.exited: asyncio.Future[int] = loop.create_future()
        self.stdout = asyncio.StreamReader(loop=loop)
        self.stdin: asyncio.WriteTransport | None = None
        #: Clear while the program leaves more unread on its stdin than the pipe's high-water
        #: mark (its reader then waits: see ``ProgramConnection``); set again as it reads.
        self.writable = asyncio.Event()
        self.writable.set()
        self._stdout_transport: asyncio.ReadTransport | None = None
        self._pidfd: int | None = None

    @classmethod
    async def start(
        cls, command: Sequence[str], env: Mapping[str, str], cwd: str | None = None
    ) -> ProgramProcess:
        """Start ``command`` in a new session with stdin and stdout as pipes (raises OSError).

        The fork and exec run on the loop's thread, as asyncio's own subprocesses do: it is
        quick, and the pidfd must be opened before anything else could reap the pid."""
        process = cls(_spawn(command, env, cwd), asyncio.get_running_loop())
        process._watch()
        try:
            await process._connect()
        except BaseException:
            process.kill()
            process.close_pipes()
            raise
        return process

    async def _connect(self) -> None:
        stdout, stdin = self.popen.stdout, self.popen.stdin
        assert stdout is not None
        assert stdin is not None
        reader = self.stdout
        transport, _ = await self.loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), stdout
        )
        self._stdout_transport = transport
        writable = self.writable
        self.stdin, _ = await self.loop.connect_write_pipe(lambda: _WriteFlow(writable), stdin)

    def _watch(self) -> None:
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            threading.Thread(target=self._wait_in_thread, daemon=True).start()
            return
        self._pidfd = pidfd
        self.loop.add_reader(pidfd, self._pidfd_readable)

    def _pidfd_readable(self) -> None:
        returncode = self.popen.poll()  # waitpid(pid, WNOHANG): reaps exactly this child
        if returncode is not None:
            self._stop_watching()
            self._exited(returncode)

    def _wait_in_thread(self) -> None:
        returncode = self.popen.wait()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            self.loop.call_soon_threadsafe(self._exited, returncode)

    def _exited(self, returncode: int) -> None:
        if not self.exited.done():
            self.exited.set_result(returncode)

    def _stop_watching(self) -> None:
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is not None:
            with contextlib.suppress(Exception):
                self.loop.remove_reader(pidfd)
            os.close(pidfd)

    @property
    def returncode(self) -> int | None:
        return self.exited.result() if self.exited.done() else None

    def kill(self) -> None:
        """SIGKILL the program (never its jobs: they run in sessions of their own)."""
        if self.popen.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, OSError):
            if self._pidfd is not None:
                # Through the pidfd: it cannot hit another process that got the pid since.
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                self.popen.kill()

    def close_pipes(self) -> None:
        for transport in (self.stdin, self._stdout_transport):
            if transport is not None:
                with contextlib.suppress(Exception):
                    transport.close()

    def reap_now(self, timeout: float = 5.0) -> None:
        """Kill and reap synchronously: for a program whose event loop is gone (a test's)."""
        self.kill()
        self._stop_watching()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)


def _spawn(
    command: Sequence[str], env: Mapping[str, str], cwd: str | None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(env), cwd=cwd,
        start_new_session=True,
    )  # fmt: skip
