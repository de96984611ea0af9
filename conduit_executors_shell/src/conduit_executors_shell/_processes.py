"""Finding, watching and stopping a job's processes, by identity rather than by pid alone.

A pid is only trusted together with its psutil create time, so a pid the system has since given
to an unrelated process is never adopted or signalled. Stopping is verified by looking, not
assumed from having sent a signal; the looks of the stops in flight share one walk of the process
table (``_census``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.to_thread
import psutil

from conduit_core.extension import StopEvidence
from conduit_executors_shell._census import ProcessCensus, ProcessQuery
from conduit_executors_shell._metadata import JobRecord

__all__ = [
    "CREATE_TIME_TOLERANCE",
    "find_wrapper",
    "group_is_empty",
    "stop_job",
    "wait_for_wrapper_exit",
]

# psutil derives create times from the boot time, which two processes may read a whole second
# apart after a clock adjustment. A pid reused within that second by an unrelated process is also
# required to lead our process group to be taken for ours, which it does not.
CREATE_TIME_TOLERANCE = 1.0
# How long SIGKILL gets to take effect before a stop is reported unverified.
_KILL_DEADLINE_SECONDS = 5.0
_POLL_FIRST_SECONDS = 0.005
_POLL_LONGEST_SECONDS = 0.1


def find_wrapper(record: JobRecord) -> psutil.Process | None:
    """The job's wrapper if that very process still exists (as a zombie, even), else ``None``."""
    try:
        process = psutil.Process(record.pid)
        if abs(process.create_time() - record.create_time) > CREATE_TIME_TOLERANCE:
            return None
        if os.getpgid(record.pid) != record.pgid:
            return None
    except (psutil.NoSuchProcess, ProcessLookupError):
        return None
    return process


def group_is_empty(pgid: int) -> bool:
    """True when no process (not even a zombie) is left in the process group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


async def wait_for_wrapper_exit(
    record: JobRecord,
    reap: Callable[[], object],
    *,
    our_child: bool,
    proven: Callable[[JobRecord], Awaitable[bool]] | None = None,
) -> None:
    """Wait until the wrapper has exited, without a busy loop: a pidfd where the OS has them.

    ``our_child``: this process started the wrapper and has not reaped it, so its pid cannot
    have been reused and needs no identity check. ``proven``: a batched identity check asked
    after the pidfd was opened (``WrapperChecks.alive``); what it does not prove is checked by
    ``find_wrapper``.
    """
    try:
        pidfd = os.pidfd_open(record.pid)
    except ProcessLookupError:
        reap()
        return
    except (AttributeError, OSError):
        await _poll_until_gone(record)
        reap()
        return
    try:
        # The pidfd pins whatever process has the pid now; make sure that is still the wrapper.
        if (
            our_child
            or (proven is not None and await proven(record))
            or await anyio.to_thread.run_sync(find_wrapper, record) is not None
        ):
            await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)
    reap()


async def _poll_until_gone(record: JobRecord) -> None:
    delay = _POLL_FIRST_SECONDS
    while True:
        wrapper = await anyio.to_thread.run_sync(find_wrapper, record)
        if wrapper is None or _is_zombie(wrapper):
            return
        await anyio.sleep(delay)
        delay = min(delay * 2, _POLL_LONGEST_SECONDS)


async def stop_job(
    record: JobRecord | None,
    *,
    execution_id: str,
    marker: str | None = None,
    stop_signal: signal.Signals,
    grace_seconds: float,
    reap: Callable[[], object],
    census: ProcessCensus,
) -> StopEvidence:
    """Signal every process of the job, wait the grace, escalate to SIGKILL, then verify.

    A job's processes are the members of its process group and session while its wrapper is
    verified to be ours (a group id cannot be reused while the group lives), and every process
    tagged with the execution id (or carrying a launch marker of the execution), which finds a job
    that left its group, or whose metadata was never recorded. With ``marker`` (the launch's own,
    from its metadata or its launch intent) only processes carrying exactly that marker are tagged.
    Every look at the job's processes is a scan of ``census``, shared with the scans in flight.
    """
    trust_group = False
    if record is not None:
        trust_group = await anyio.to_thread.run_sync(find_wrapper, record) is not None
    scan = _Scanner(record, execution_id, marker=marker, trust_group=trust_group, census=census)
    found = await scan.processes()
    if not found:
        reap()
        return StopEvidence(verified=True, detail=f"no process of {scan.description} was running")
    await anyio.to_thread.run_sync(_send, found, stop_signal)
    # A process of the job that appears during the grace gets the signal too: a stop that lands
    # while the wrapper is still starting the job (the wrapper outlives the signal by design)
    # would otherwise leave the job unsignalled until SIGKILL, the whole grace later.
    signalled = set(found)
    remaining = await scan.wait_until_gone(
        grace_seconds, reap, signal_new=stop_signal, signalled=signalled
    )
    killed = 0
    deadline = time.monotonic() + _KILL_DEADLINE_SECONDS
    wrapper_pid = record.pid if record is not None else None
    while remaining and time.monotonic() < deadline:
        # The wrapper goes last: once the job is dead it records the status and exits itself.
        targets = [p for p in remaining if p.pid != wrapper_pid] or remaining
        killed += await anyio.to_thread.run_sync(_send, targets, signal.SIGKILL)
        remaining = await scan.wait_until_gone(_KILL_DEADLINE_SECONDS / 10, reap)
    reap()
    appeared = len(signalled) - len(found)
    late = f" ({appeared} of them appeared after the first signal)" if appeared else ""
    if remaining:
        pids = ", ".join(str(p.pid) for p in remaining)
        return StopEvidence(
            verified=False, detail=f"{scan.description}: still running after SIGKILL: {pids}"
        )
    return StopEvidence(
        verified=True,
        detail=(
            f"sent {stop_signal.name} to {len(signalled)} process(es) of {scan.description}"
            f"{late}; "
            f"{killed} needed SIGKILL; none remain"
        ),
    )


class _Scanner:
    def __init__(
        self,
        record: JobRecord | None,
        execution_id: str,
        *,
        marker: str | None,
        trust_group: bool,
        census: ProcessCensus,
    ) -> None:
        self._census = census
        self._query = ProcessQuery(
            # Nothing created before the wrapper can belong to the job.
            created_after=record.create_time - CREATE_TIME_TOLERANCE if record else 0.0,
            group=record.pgid if record is not None and trust_group else None,
            marker=marker,
            execution_id=execution_id,
        )
        group = f"process group {record.pgid}" if record and trust_group else "no trusted group"
        self.description = f"execution {execution_id} ({group})"

    async def processes(self) -> list[psutil.Process]:
        """The job's live processes (zombies run nothing and are left to their parents)."""
        return await self._census.processes(self._query)

    async def wait_until_gone(
        self,
        within_seconds: float,
        reap: Callable[[], object],
        *,
        signal_new: signal.Signals | None = None,
        signalled: set[psutil.Process] | None = None,
    ) -> list[psutil.Process]:
        """The job's processes left after ``within_seconds`` (or none, as soon as none is).
        With ``signal_new``, each one found that is not in ``signalled`` (psutil identities: pid
        and create time) is sent that signal and added to it."""
        deadline = time.monotonic() + within_seconds
        delay = _POLL_FIRST_SECONDS
        while True:
            reap()
            remaining = await self.processes()
            if signal_new is not None and signalled is not None:
                fresh = [process for process in remaining if process not in signalled]
                if fresh:
                    signalled.update(fresh)
                    await anyio.to_thread.run_sync(_send, fresh, signal_new)
            if not remaining or time.monotonic() >= deadline:
                return remaining
            await anyio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, _POLL_LONGEST_SECONDS)


def _send(processes: list[psutil.Process], sig: signal.Signals) -> int:
    sent = 0
    for process in processes:
        try:
            # psutil refuses to signal a process whose pid was reused since it was listed.
            process.send_signal(sig)
            sent += 1
        except psutil.Error:
            pass
    return sent


def _is_zombie(process: psutil.Process) -> bool:
    try:
        status: str = process.status()
        return bool(status == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return True
