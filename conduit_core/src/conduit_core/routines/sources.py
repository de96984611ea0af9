"""The unified schedule surface: schedule sources and their multiplexer.

A :class:`ScheduleSource` projects the schedules one owner holds into :class:`ScheduleRecord`\\ s.
Its ``read()`` never raises: a source that is down answers ``degraded`` with what it still has
(a stale cache, or nothing), so one dead source never takes the merged view down. Writes route
by owner through :class:`ScheduleMultiplexer`; every refusal is a ``ConduitError`` with a stable
``code`` and an ``http_status``.

Domains: ``conduit`` (Routines fired by conduit) and ``external`` (schedules another system fires,
such as the host's cron). Manageability: ``managed`` (conduit owns and writes them) or
``observe-only`` (conduit only reads them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Annotated, Any, Literal, Protocol, TypeVar, runtime_checkable

import anyio
import msgspec

from conduit_core.errors import ConduitError, DuplicateRegistrationError, NotFoundError
from conduit_core.extension import (
    Domain,
    Health,
    Manageability,
    ScheduleRecord,
    ScheduleSource,
    SourceRead,
)
from conduit_core.model import MisfirePolicy, Routine, WorkTemplate
from conduit_core.routines.errors import (
    DomainViolationError,
    ReadOnlySourceError,
    ScheduleNotFoundError,
    SourceUnavailableError,
)
from conduit_core.validation import ROUTINE_ID_PATTERN, TIMEZONE_MAX_LENGTH, NameStr, Seconds

__all__ = [
    "Domain",
    "ManagedScheduleSource",
    "Manageability",
    "MergedRead",
    "ScheduleChange",
    "ScheduleCreate",
    "ScheduleMultiplexer",
    "ScheduleRecord",
    "ScheduleSource",
    "SourceRead",
    "SourceStatus",
    "routine_record",
]

_TARGET_MAX = 200
_T = TypeVar("_T")


class SourceStatus(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    domain: Domain
    manageability: Manageability
    status: Health
    detail: str | None = None
    count: int = 0


class MergedRead(msgspec.Struct, frozen=True, kw_only=True):
    """The merged view: every source's records and each source's own status."""

    records: list[ScheduleRecord]
    sources: list[SourceStatus]


#: Bounds a decoded request enforces (``/v1/schedules``): a typo or a hostile value is refused
#: naming its field, never stored (names and durations follow conduit_core.validation).
_Ident = NameStr
_Spec = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
_Zone = Annotated[str, msgspec.Meta(min_length=1, max_length=TIMEZONE_MAX_LENGTH)]
_Grace = Seconds


class ScheduleCreate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A request to create a schedule. ``source`` picks the owner (default: the managed source
    of ``domain``)."""

    spec: _Spec
    timezone: _Zone = "UTC"
    domain: Domain = "conduit"
    source: _Ident | None = None
    #: At most 100 characters: a fire's Work id ``routine:<id>:<ms>`` must fit in 128.
    id: Annotated[str, msgspec.Meta(pattern=ROUTINE_ID_PATTERN)] | None = None
    scope: _Ident | None = None
    target: WorkTemplate | None = None
    misfire: MisfirePolicy = MisfirePolicy.COALESCE
    grace_seconds: _Grace = 60.0
    #: Anything an external source needs beyond the above.
    extra: dict[str, Any] = {}


class ScheduleChange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A change to one schedule: pause, resume, run now, or edit its spec/timezone."""

    action: Literal["pause", "resume", "run", "edit"]
    spec: _Spec | None = None
    timezone: _Zone | None = None


@runtime_checkable
class ManagedScheduleSource(Protocol):
    """A source conduit may write. ``local_id`` is the id without the ``<source>:`` prefix.

    Writes raise ``ConduitError``s: ``not_found``, ``illegal_transition``/``routine_busy``,
    ``duplicate_firing_owner``, ``source_unavailable`` when the backend is down, …
    """

    async def create(self, request: ScheduleCreate) -> ScheduleRecord: ...

    async def change(self, local_id: str, change: ScheduleChange) -> ScheduleRecord: ...

    async def delete(self, local_id: str) -> None: ...


def routine_record(routine: Routine, *, source: str = "conduit") -> ScheduleRecord:
    """The schedule record of a conduit Routine (for the managed conduit source)."""
    target = routine.target
    if target.work_id is not None:
        summary = f"input for work {target.work_id}"
    else:
        summary = f"{target.kind} work on binding {target.binding or '?'}"
    return ScheduleRecord(
        id=f"{source}:{routine.id}",
        source=source,
        domain="conduit",
        manageability="managed",
        spec=routine.cron_spec,
        timezone=routine.timezone,
        next_run_at_ms=routine.next_run_at_ms,
        status=str(routine.status),
        last_run_at_ms=routine.last_run_at_ms,
        last_error=routine.last_error,
        target=f"{summary} in scope {target.scope or routine.scope}",
        changed_by=routine.changed_by,
    )


# --- Multiplexer ----------------------------------------------------------------------------


class ScheduleMultiplexer:
    """Merged reads over every source; writes routed to the owning source."""

    def __init__(self, sources: Sequence[ScheduleSource]) -> None:
        self._sources: dict[str, ScheduleSource] = {}
        for source in sources:
            if source.name in self._sources:
                raise DuplicateRegistrationError(
                    f"schedule source {source.name!r} is registered twice"
                )
            if ":" in source.name:
                raise ConduitError(f"schedule source name {source.name!r} may not contain ':'")
            self._sources[source.name] = source

    @property
    def sources(self) -> list[ScheduleSource]:
        return list(self._sources.values())

    async def read(self) -> MergedRead:
        """Read every source concurrently; a failing source is reported, never raised."""
        sources = list(self._sources.values())
        reads: list[SourceRead] = [SourceRead() for _ in sources]

        async def read_one(index: int, source: ScheduleSource) -> None:
            try:
                reads[index] = await source.read()
            except Exception as exc:  # a source that breaks its contract degrades, no more
                reads[index] = SourceRead(
                    status="degraded", detail=f"read failed: {type(exc).__name__}: {exc}"
                )

        async with anyio.create_task_group() as group:
            for index, source in enumerate(sources):
                group.start_soon(read_one, index, source)
        records = [record for result in reads for record in result.records]
        records.sort(key=lambda r: (r.next_run_at_ms is None, r.next_run_at_ms or 0, r.id))
        statuses = [
            SourceStatus(
                source=source.name,
                domain=source.domain,
                manageability=source.manageability,
                status=result.status,
                detail=result.detail,
                count=len(result.records),
            )
            for source, result in zip(sources, reads, strict=True)
        ]
        return MergedRead(records=records, sources=statuses)

    def _route(self, schedule_id: str) -> tuple[ScheduleSource, str]:
        prefix, sep, local_id = schedule_id.partition(":")
        if sep:
            if prefix not in self._sources or not local_id:
                raise ScheduleNotFoundError(schedule_id)
            return self._sources[prefix], local_id
        # An unprefixed id names a conduit Routine.
        default = self._managed_source("conduit")
        if default is None or not schedule_id:
            raise ScheduleNotFoundError(schedule_id)
        return default, schedule_id

    def _managed_source(self, domain: Domain) -> ScheduleSource | None:
        for source in self._sources.values():
            if source.domain == domain and source.manageability == "managed":
                return source
        return None

    @staticmethod
    def _writable(source: ScheduleSource, what: str) -> ManagedScheduleSource:
        if source.manageability != "managed" or not isinstance(source, ManagedScheduleSource):
            raise ReadOnlySourceError(
                f"schedule source {source.name!r} is observe-only: cannot {what}"
            )
        return source

    async def create(self, request: ScheduleCreate) -> ScheduleRecord:
        """Create a schedule in its owning source."""
        if request.source is not None:
            source = self._sources.get(request.source)
            if source is None:
                raise NotFoundError("schedule source", request.source)
        else:
            found = self._managed_source(request.domain)
            if found is None:
                raise NotFoundError("managed schedule source for domain", request.domain)
            source = found
        if source.domain != request.domain:
            raise DomainViolationError(
                f"a {request.domain}-domain schedule cannot be created in source "
                f"{source.name!r} (domain {source.domain}): conduit never fires its Routines "
                "through another system's scheduler"
            )
        writer = self._writable(source, "create schedules")
        return await _guard(source, writer.create(request))

    async def change(
        self, schedule_id: str, change: ScheduleChange, *, actor: str | None = None
    ) -> ScheduleRecord:
        """Route the change to its source; ``actor`` (the token's name) is kept by a source
        that records it (``change_as``: conduit's own Routines)."""
        source, local_id = self._route(schedule_id)
        writer = self._writable(source, f"{change.action} {schedule_id!r}")
        change_as = getattr(writer, "change_as", None)
        if actor is not None and change_as is not None:
            return await _guard(source, change_as(local_id, change, actor))
        return await _guard(source, writer.change(local_id, change))

    async def delete(self, schedule_id: str) -> None:
        source, local_id = self._route(schedule_id)
        writer = self._writable(source, f"delete {schedule_id!r}")
        await _guard(source, writer.delete(local_id))

    async def pause(self, schedule_id: str) -> ScheduleRecord:
        return await self.change(schedule_id, ScheduleChange(action="pause"))

    async def resume(self, schedule_id: str) -> ScheduleRecord:
        return await self.change(schedule_id, ScheduleChange(action="resume"))

    async def run_now(self, schedule_id: str, *, actor: str | None = None) -> ScheduleRecord:
        return await self.change(schedule_id, ScheduleChange(action="run"), actor=actor)


async def _guard(source: ScheduleSource, pending: Awaitable[_T]) -> _T:
    """Await a source write; a backend that cannot be reached is ``source_unavailable``."""
    try:
        return await pending
    except ConduitError:
        raise
    except OSError as exc:  # ConnectionError, TimeoutError, … : the owner is down
        raise SourceUnavailableError(
            f"schedule source {source.name!r} is unavailable: {exc}"
        ) from exc
