"""One walk of the process table for every process scan in flight: what lets a successor stop
and adopt many jobs at once.

Finding a job's processes (a stop, its verification polls, a recovery looking for processes that
carry a launch marker) means walking the whole machine's process table and reading the
environment of every process that could be the job's. A successor adopting the jobs of a paused
daemon runs dozens of those at once, each walking the table through a thread of its own and
competing for the GIL. ``ProcessCensus`` gathers the scans in flight into one look: one thread
hop and one walk that records, per live process, its create time, process group and session,
and, only where a waiting scan could match it by its environment (created after that scan's
cutoff and not already its job's by group), the two values scans match (``LAUNCH_MARKER``,
``EXECUTION_TAG``), reading each environment once. Each scan then takes what its own
``ProcessQuery`` selects: the rules one scan alone applies (``processes_matching`` with one
query is the single path), so the answer never depends on the batch.

A look starts only after every scan it answers was asked (a scan asked during a look waits for
the next one), so a verification poll never reads a table taken before its signals were sent. The
answers are the ``psutil.Process`` objects the walk iterated, so psutil still refuses to signal a
pid reused since it was listed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio.to_thread
import psutil

from conduit_executors_shell._gathering import GatheredLooks
from conduit_executors_shell._launch import EXECUTION_TAG, LAUNCH_MARKER

__all__ = [
    "CensusEntry",
    "ProcessCensus",
    "ProcessQuery",
    "marker_execution",
    "processes_matching",
    "take_census",
]


def marker_execution(marker: str) -> str:
    """The execution id a marker ``<execution>/<epoch>/<nonce>`` names (ids may hold ``/``)."""
    return marker.rsplit("/", 2)[0]


@dataclass(slots=True)
class CensusEntry:
    """One live process as one look saw it."""

    process: psutil.Process
    create_time: float | None
    pgid: int | None = None
    sid: int | None = None
    #: Whether the environment was read; ``marker`` and ``tag`` are its values (``None``: absent
    #: or unreadable).
    environ_read: bool = False
    marker: str | None = None
    tag: str | None = None


@dataclass(frozen=True, slots=True)
class ProcessQuery:
    """Which live processes one scan wants (never this process, never a zombie).

    ``created_after``: processes created before it cannot be the job's (``None``: any process,
    even one whose create time is unreadable). ``group``: the job's process group, trusted while
    its wrapper is verified to be ours; its members (by group or session) are the job's. Then by
    environment: with ``marker`` only processes carrying exactly that launch marker (it is unique
    per launch; an execution id is not across installations), else those tagged with
    ``execution_id`` or carrying a marker that names it.
    """

    created_after: float | None
    group: int | None = None
    marker: str | None = None
    execution_id: str | None = None

    @classmethod
    def marked(cls, marker: str) -> ProcessQuery:
        """Every live process carrying exactly this launch marker, whenever it was created."""
        return cls(created_after=None, marker=marker)

    def admits(self, create_time: float | None) -> bool:
        if self.created_after is None:
            return True
        return create_time is not None and create_time >= self.created_after

    def in_group(self, entry: CensusEntry) -> bool:
        return self.group is not None and self.group in (entry.pgid, entry.sid)

    def tagged(self, marker: str | None, tag: str | None) -> bool:
        if self.marker is not None:
            return marker == self.marker
        # No marker known (generation 1/2, or no metadata and no intent): the tag or a marker
        # naming the execution finds a job whose metadata was never recorded.
        if self.execution_id is None:
            return False
        if tag == self.execution_id:
            return True
        return marker is not None and marker_execution(marker) == self.execution_id

    def select(self, census: Sequence[CensusEntry]) -> list[psutil.Process]:
        return [
            entry.process
            for entry in census
            if self.admits(entry.create_time)
            and (self.in_group(entry) or self.tagged(entry.marker, entry.tag))
        ]


def take_census(queries: Sequence[ProcessQuery]) -> list[CensusEntry]:
    """One walk of the process table: every live process some query admits, with its group and
    session (when a query trusts a group) and, where some query could match it only by its
    environment, the environment's two values (each environment read once)."""
    own = os.getpid()
    groups = any(query.group is not None for query in queries)
    census = []
    for process in psutil.process_iter(["create_time", "status"]):
        created = process.info["create_time"]
        if process.info["status"] == psutil.STATUS_ZOMBIE or process.pid == own:
            continue
        if not any(query.admits(created) for query in queries):
            continue
        entry = CensusEntry(process, created)
        if groups:
            with contextlib.suppress(ProcessLookupError):  # gone: in no group
                entry.pgid, entry.sid = os.getpgid(process.pid), os.getsid(process.pid)
        if any(query.admits(created) and not query.in_group(entry) for query in queries):
            entry.environ_read = True
            try:
                environ = process.environ()
            except psutil.Error:
                environ = {}
            entry.marker, entry.tag = environ.get(LAUNCH_MARKER), environ.get(EXECUTION_TAG)
        census.append(entry)
    return census


def processes_matching(queries: Sequence[ProcessQuery]) -> list[list[psutil.Process]]:
    """Per query, the live processes it selects, from one walk of the process table."""
    census = take_census(queries)
    return [query.select(census) for query in queries]


class ProcessCensus:
    """Gathers concurrent process scans into one look (one thread hop, one walk) at a time
    (``GatheredLooks``). When a look fails, each of its callers walks alone, as it would have
    without the census (and meets the error itself)."""

    def __init__(
        self,
        look: Callable[[Sequence[ProcessQuery]], list[list[psutil.Process]]] = processes_matching,
    ) -> None:
        self._gathered: GatheredLooks[ProcessQuery, list[psutil.Process]] = GatheredLooks(look)

    @property
    def looks(self) -> int:
        """How many looks answered the scans so far (the bench and tests read it)."""
        return self._gathered.looks

    @property
    def scans(self) -> int:
        return self._gathered.asked

    async def processes(self, query: ProcessQuery) -> list[psutil.Process]:
        """The live processes ``query`` selects, from a walk that started after this call."""
        found = await self._gathered.ask(query)
        if found is not None:
            return found
        # The shared look failed: this scan walks alone, exactly as without the census.
        return (await anyio.to_thread.run_sync(processes_matching, [query]))[0]
