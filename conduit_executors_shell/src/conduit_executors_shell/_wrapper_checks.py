"""Many wrapper identity checks in one look: what lets a restart adopt a thousand jobs quickly.

A recovery (and the start of each adopted job's observation) must prove the job's wrapper is
still *that* process: same pid, same create time (within ``CREATE_TIME_TOLERANCE``), still
leading its process group. ``find_wrapper`` proves it for one job with a ``psutil.Process``
(three ``/proc`` reads, the system boot time among them) behind a thread hop of its own. After
a restart hundreds of those run at once, so ``WrapperChecks`` gathers the checks in flight into
one thread hop that reads the boot time once and one ``/proc/<pid>/stat`` per job.

The batch only ever *proves* a wrapper alive: ``False`` means "not proven", and the caller then
takes the single-job path it always took (``find_wrapper``, the exit status, the marker scan),
so a refused or unclear job is judged exactly as before. A look starts only after every check it
answers was asked (a check asked during a look waits for the next one), so it never vouches for
a pid with a reading taken before the caller opened its pidfd or made its recovery claim.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import psutil

from conduit_executors_shell._gathering import GatheredLooks
from conduit_executors_shell._metadata import JobRecord
from conduit_executors_shell._processes import CREATE_TIME_TOLERANCE, find_wrapper

__all__ = ["WrapperChecks", "wrappers_alive"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def wrappers_alive(records: Sequence[JobRecord]) -> list[bool]:
    """Per record: its wrapper is that very process (a zombie even) and leads its group.

    The same checks as ``find_wrapper`` (create time within the tolerance, process group), read
    from ``/proc/<pid>/stat`` with the boot time read once; elsewhere than Linux, one
    ``find_wrapper`` per record.
    """
    if not psutil.LINUX:
        return [find_wrapper(record) is not None for record in records]
    try:
        boot_time = psutil.boot_time()
    except Exception:
        return [False] * len(records)  # unproven: each caller takes the single-job path
    return [_alive(record, boot_time) for record in records]


def _alive(record: JobRecord, boot_time: float) -> bool:
    if record.pid <= 0:
        return False
    try:
        with open(f"/proc/{record.pid}/stat", "rb") as stat:
            data = stat.read()
        # Fields after the command name, which may hold spaces and parentheses: state, ppid,
        # pgrp, ... starttime (field 22 of proc(5), in clock ticks since boot).
        fields = data[data.rindex(b")") + 2 :].split()
        pgrp = int(fields[2])
        create_time = int(fields[19]) / _CLOCK_TICKS + boot_time
    except (OSError, ValueError, IndexError):
        return False
    return abs(create_time - record.create_time) <= CREATE_TIME_TOLERANCE and pgrp == record.pgid


class WrapperChecks:
    """Gathers concurrent wrapper checks into one look (one thread hop) at a time
    (``GatheredLooks``); a failed look proves nothing, and each caller takes its single-job path.
    """

    def __init__(self, look: Callable[[Sequence[JobRecord]], list[bool]] = wrappers_alive) -> None:
        self._gathered: GatheredLooks[JobRecord, bool] = GatheredLooks(look)

    @property
    def looks(self) -> int:
        """How many looks answered the checks so far (the bench and tests read it)."""
        return self._gathered.looks

    @property
    def checks(self) -> int:
        return self._gathered.asked

    async def alive(self, record: JobRecord) -> bool:
        """True only when the wrapper is proven to be that very process and to lead its group."""
        return bool(await self._gathered.ask(record))
