"""Schedule sources: how a package adds schedules another system owns to conduit's view.

A source projects one owner's schedules into :class:`ScheduleRecord` s. Its ``read()`` never
raises: a source that is down answers ``degraded`` with what it still has. A plugin returns its
sources from the ``conduit_schedule_sources`` hook; conduit lists them beside its own Routines
(``GET /v1/schedules``) and never fires them.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import msgspec

__all__ = ["Domain", "Health", "Manageability", "ScheduleRecord", "ScheduleSource", "SourceRead"]

#: ``conduit``: fired by conduit's Routines; ``external``: fired by another system (host cron…).
Domain = Literal["conduit", "external"]
#: ``managed``: conduit owns and writes them; ``observe-only``: conduit only reads them.
Manageability = Literal["managed", "observe-only"]
Health = Literal["ok", "degraded"]


class ScheduleRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One schedule as every source projects it. ``id`` is ``<source>:<id in the source>``."""

    id: str
    source: str
    domain: Domain
    manageability: Manageability
    spec: str
    timezone: str = "UTC"
    next_run_at_ms: int | None = None
    #: The owner's status word (a Routine status, ``scheduled``, ``on_boot``, ``invalid``, …).
    status: str
    last_run_at_ms: int | None = None
    last_error: str | None = None
    #: A one-line summary of what a fire does.
    target: str = ""
    #: The named API token whose pause, resume, run now or edit last changed it (if the source
    #: keeps it: conduit's own Routines do).
    changed_by: str | None = None


class SourceRead(msgspec.Struct, frozen=True, kw_only=True):
    """What one ``read()`` returns; ``degraded`` carries a ``detail`` saying why."""

    status: Health = "ok"
    records: list[ScheduleRecord] = []
    detail: str | None = None


@runtime_checkable
class ScheduleSource(Protocol):
    """A read-only view of one owner's schedules."""

    @property
    def name(self) -> str: ...

    @property
    def domain(self) -> Domain: ...

    @property
    def manageability(self) -> Manageability: ...

    async def read(self) -> SourceRead:
        """Every schedule this source knows. Never raises: down means ``degraded``."""
        ...
