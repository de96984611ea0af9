"""``[[routines]]`` from ``conduit.toml`` reconciled into the ledger, on start and on reload.

Config-owned rows carry ``from_config=True``. A missing one is created, a changed one gets its
new spec, target and misfire policy (its runtime state — status, claim, history — is left
alone), and a config-owned row no longer declared is removed. A row created through the CLI or
HTTP with the same id as a declared Routine is never taken over: it is reported as a conflict.
Running it twice changes nothing the second time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from conduit_core.config import Config, RoutineSpec
from conduit_core.errors import ConduitError
from conduit_core.model import MisfirePolicy, Routine, WorkKind, WorkStep, WorkTemplate
from conduit_core.routines import ledger
from conduit_core.routines.fire import check_bound_owner
from conduit_core.routines.managed import new_routine
from conduit_core.routines.occurrence import parse_spec
from conduit_core.routines.sources import ScheduleCreate
from conduit_core.runtime import Clock
from conduit_core.storage import Store

__all__ = ["ReconcileReport", "reconcile_routines", "request_of"]

log = logging.getLogger("conduit.routines")


@dataclass
class ReconcileReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: Ids left as they are, with the reason (a busy fire, an id owned by the CLI/API, …).
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.removed)


def request_of(spec: RoutineSpec) -> ScheduleCreate:
    """The create request a ``[[routines]]`` entry stands for."""
    return ScheduleCreate(
        id=spec.id,
        spec=spec.cron,
        timezone=spec.timezone,
        scope=spec.scope,
        target=WorkTemplate(
            binding=spec.binding, scope=spec.scope, kind=WorkKind(spec.kind), input=spec.input,
            then=[
                WorkStep(
                    binding=step.binding, scope=step.scope, kind=WorkKind(step.kind),
                    input=step.input,
                )
                for step in spec.then
            ],
        ),
        misfire=MisfirePolicy(spec.misfire),
        grace_seconds=spec.grace_seconds,
    )


def _declared(current: Routine) -> tuple[object, ...]:
    return (
        current.cron_spec,
        current.timezone,
        current.scope,
        current.target,
        current.misfire,
        current.grace_seconds,
    )


async def reconcile_routines(store: Store, config: Config, clock: Clock) -> ReconcileReport:
    """Make the config-owned ledger rows match ``config.routines``."""
    report = ReconcileReport()
    now = clock.now_ms()
    bindings = {name: b.scope for name, b in config.bindings.items()}
    existing = {r.id: r for r in await store.list_routines()}
    declared: set[str] = set()
    for spec in config.routines:
        declared.add(spec.id)
        try:
            wanted = new_routine(
                request_of(spec), now_ms=now, bindings=bindings, scopes=config.scopes,
                from_config=True,
            )  # fmt: skip
        except ConduitError as exc:
            report.skipped[spec.id] = f"[{exc.code}] {exc.message}"
            continue
        current = existing.get(spec.id)
        if current is None:
            try:
                await store.create_routine(wanted, bound_work_owner_check=check_bound_owner)
            except ConduitError as exc:
                report.skipped[spec.id] = f"[{exc.code}] {exc.message}"
                continue
            report.created.append(spec.id)
        elif not current.from_config:
            report.skipped[spec.id] = "a Routine with this id was added through the CLI or API"
        elif _declared(current) == _declared(wanted):
            report.unchanged.append(spec.id)
        else:
            try:
                await store.apply_routine(spec.id, _updater(wanted, now))
            except ConduitError as exc:  # routine_busy while a fire runs, …
                report.skipped[spec.id] = f"[{exc.code}] {exc.message} (retried on reload)"
                continue
            report.updated.append(spec.id)
    for routine_id, routine in existing.items():
        stale = routine.from_config and routine_id not in declared
        if stale and await store.delete_routine(routine_id):
            report.removed.append(routine_id)
    for routine_id, why in report.skipped.items():
        log.warning("routine %s from config not reconciled: %s", routine_id, why)
    if report.changed:
        log.info("routines reconciled: created=%s updated=%s removed=%s",
                 report.created, report.updated, report.removed)  # fmt: skip
    return report


def _updater(wanted: Routine, now: int) -> Callable[[Routine], Routine]:
    def update(current: Routine) -> Routine:
        kept = msgspec.structs.replace(
            current,
            scope=wanted.scope,
            target=wanted.target,
            misfire=wanted.misfire,
            grace_seconds=wanted.grace_seconds,
            updated_at_ms=now,
        )
        if (current.cron_spec, current.timezone) == (wanted.cron_spec, wanted.timezone):
            return kept
        spec = parse_spec(wanted.cron_spec, wanted.timezone)
        return ledger.edit_schedule(
            kept, cron_spec=wanted.cron_spec, timezone=wanted.timezone, spec=spec, now_ms=now
        )

    return update
