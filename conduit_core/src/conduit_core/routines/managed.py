"""The ``conduit`` schedule source: conduit's own Routines, managed over the store.

Every write is validated before anything is stored (spec, timezone, once@ not in the past,
binding, scope, the one-firing-owner invariant) and each transition runs in the store's write
transaction on the fresh row. Every write pokes the ticker (``on_change``).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Collection, Mapping

import msgspec

from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.model import Routine, WorkTemplate
from conduit_core.routines import ledger
from conduit_core.routines.errors import BoundRecurringScheduleError
from conduit_core.routines.fire import check_bound_owner
from conduit_core.routines.occurrence import Spec, parse_spec, validate_once_not_past
from conduit_core.routines.sources import (
    Domain,
    Manageability,
    ScheduleChange,
    ScheduleCreate,
    ScheduleRecord,
    SourceRead,
    routine_record,
)
from conduit_core.runtime import Clock
from conduit_core.storage import RoutineRun, Store
from conduit_core.validation import MAX_SECONDS, finite_number

__all__ = ["ConduitRoutineSource", "InvalidRoutineIdError", "new_routine"]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class InvalidRoutineIdError(ConduitError):
    code = "invalid_routine_id"
    http_status = 400


def _valid_id(routine_id: str) -> str:
    if not _ID.fullmatch(routine_id):
        raise InvalidRoutineIdError(
            f"routine id {routine_id!r} must be 1-128 letters, digits, '_', '.' or '-' "
            "(starting with a letter or digit)"
        )
    return routine_id


def new_routine(
    request: ScheduleCreate,
    *,
    now_ms: int,
    bindings: Mapping[str, str] | None = None,
    scopes: Collection[str] | None = None,
    from_config: bool = False,
) -> Routine:
    """A validated idle Routine armed at its next occurrence; raises on any bad input.

    ``bindings`` maps each known binding to its default scope and ``scopes`` lists known scopes
    (``None``: not checked). Nothing is stored here.
    """
    routine_id = _valid_id(request.id or f"r-{secrets.token_hex(5)}")
    spec = parse_spec(request.spec, request.timezone)
    validate_once_not_past(spec, now_ms)
    target = request.target or WorkTemplate()
    if target.work_id is None and target.binding is None:
        raise ConduitError(
            f"routine {routine_id!r} needs a target binding (or a bound work id)",
            code="unknown_binding",
        )
    default_scope = "root"
    if target.binding is not None and bindings is not None:
        if target.binding not in bindings:
            known = ", ".join(sorted(bindings)) or "none"
            raise ConduitError(
                f"unknown binding {target.binding!r} (configured: {known})", code="unknown_binding"
            )
        default_scope = bindings[target.binding]
    scope = target.scope or request.scope or default_scope
    if scopes is not None and scope not in scopes:
        known = ", ".join(sorted(scopes)) or "none"
        raise ConduitError(f"unknown scope {scope!r} (configured: {known})", code="unknown_scope")
    first = spec.next_after(now_ms - 1) if not spec.is_recurring else spec.next_after(now_ms)
    return Routine(
        id=routine_id,
        scope=scope,
        target=msgspec.structs.replace(target, scope=scope),
        cron_spec=request.spec,
        timezone=request.timezone,
        misfire=request.misfire,
        grace_seconds=request.grace_seconds,
        next_run_at_ms=first,
        from_config=from_config,
        created_at_ms=now_ms,
        updated_at_ms=now_ms,
    )


class ConduitRoutineSource:
    """conduit's Routines as a managed schedule source (domain ``conduit``)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        bindings: Mapping[str, str] | None = None,
        scopes: Collection[str] | None = None,
        on_change: Callable[[], None] | None = None,
        name: str = "conduit",
    ) -> None:
        self.store = store
        self.clock = clock
        self.bindings = bindings
        self.scopes = scopes
        self.on_change = on_change
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def domain(self) -> Domain:
        return "conduit"

    @property
    def manageability(self) -> Manageability:
        return "managed"

    def _poke(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _record(self, routine: Routine) -> ScheduleRecord:
        return routine_record(routine, source=self._name)

    async def read(self) -> SourceRead:
        try:
            routines = await self.store.list_routines()
        except Exception as exc:  # never raise: a store that is down degrades the source
            return SourceRead(status="degraded", detail=f"store unavailable: {exc}")
        return SourceRead(records=[self._record(r) for r in routines])

    async def add(self, request: ScheduleCreate, *, from_config: bool = False) -> Routine:
        # A request built in code (CLI direct mode) skipped the decoder's bounds: re-check the
        # number, so `--grace-seconds nan` is refused here as it is over HTTP.
        finite_number("grace_seconds", request.grace_seconds, minimum=0, maximum=MAX_SECONDS)
        routine = new_routine(
            request,
            now_ms=self.clock.now_ms(),
            bindings=self.bindings,
            scopes=self.scopes,
            from_config=from_config,
        )
        stored = await self.store.create_routine(routine, bound_work_owner_check=check_bound_owner)
        self._poke()
        return stored

    async def create(self, request: ScheduleCreate) -> ScheduleRecord:
        return self._record(await self.add(request))

    async def get(self, local_id: str) -> Routine:
        return await self.store.get_routine(local_id)

    async def update(
        self, local_id: str, change: ScheduleChange, *, actor: str | None = None
    ) -> Routine:
        """Pause, resume, run now or edit one Routine (refused while a fire is in flight);
        ``actor``, the token's name, is kept as ``changed_by`` when it changes the row."""
        now = self.clock.now_ms()
        transition: Callable[[Routine], Routine]
        if change.action == "pause":
            transition = lambda r: ledger.pause(r, now)  # noqa: E731
        elif change.action == "resume":
            transition = lambda r: ledger.resume(r, ledger.spec_of(r), now)  # noqa: E731
        elif change.action == "run":
            transition = lambda r: ledger.run_now(r, now)  # noqa: E731
        else:
            current = await self.store.get_routine(local_id)
            text = change.spec or current.cron_spec
            zone = change.timezone or current.timezone
            spec = parse_spec(text, zone)
            validate_once_not_past(spec, now)
            transition = _editor(text, zone, spec, now)
        if actor is not None:
            transition = _changed_by(transition, actor)
        routine = await self.store.apply_routine(local_id, transition)
        self._poke()
        return routine

    async def change(self, local_id: str, change: ScheduleChange) -> ScheduleRecord:
        return self._record(await self.update(local_id, change))

    async def change_as(self, local_id: str, change: ScheduleChange, actor: str) -> ScheduleRecord:
        """:meth:`change` on behalf of the named token ``actor`` (kept as ``changed_by``)."""
        return self._record(await self.update(local_id, change, actor=actor))

    async def delete(self, local_id: str) -> None:
        if not await self.store.delete_routine(local_id):
            raise NotFoundError("routine", local_id)
        self._poke()

    async def history(self, local_id: str, *, limit: int = 50) -> list[RoutineRun]:
        await self.store.get_routine(local_id)  # not_found for an unknown id
        return await self.store.routine_history(local_id, limit=limit)


def _changed_by(
    transition: Callable[[Routine], Routine], actor: str
) -> Callable[[Routine], Routine]:
    def apply(routine: Routine) -> Routine:
        changed = transition(routine)
        if changed is routine:  # idempotent (pause a paused one): nothing to attribute
            return routine
        return msgspec.structs.replace(changed, changed_by=actor)

    return apply


def _editor(text: str, zone: str, spec: Spec, now: int) -> Callable[[Routine], Routine]:
    def edit(routine: Routine) -> Routine:
        if routine.target.work_id is not None and spec.is_recurring:
            raise BoundRecurringScheduleError(
                f"routine {routine.id!r} is bound to work {routine.target.work_id!r}: "
                "only a once@ spec may be bound"
            )
        return ledger.edit_schedule(routine, cron_spec=text, timezone=zone, spec=spec, now_ms=now)

    return edit
