"""The daemon's Routines: config reconciled into the ledger, the ticker, the schedule sources.

The ticker holds no durable state and is not a per-pass step: it sleeps until the next due row
(at most 60 s) and is poked by every Routine write, so an idle daemon spends no CPU on it.
"""

from __future__ import annotations

from typing import Any

import anyio
from anyio.abc import TaskStatus

from conduit_core.config import Config
from conduit_core.daemon._host import HostLoop
from conduit_core.errors import ConduitError, ConfigError
from conduit_core.routines import (
    ConduitRoutineSource,
    CrontabSource,
    KeyFor,
    ScheduleMultiplexer,
    Ticker,
    fired_by,
    parse_spec,
    reconcile_routines,
)
from conduit_core.runtime import Clock, Scheduler, binding_key
from conduit_core.storage import Claim, Store, SubmitKey

__all__ = ["RoutinesHost", "binding_keys", "check_routine_specs"]


def check_routine_specs(config: Config) -> None:
    """Every ``[[routines]]`` cron spec parses in its timezone: checked by ``config check``, at
    start and before a reload swaps anything in, so a bad spec never lands half-applied."""
    for i, routine in enumerate(config.routines):
        try:
            parse_spec(routine.cron, routine.timezone)
        except ConduitError as exc:
            raise ConfigError(
                f"{config.source}: $.routines[{i}].cron: {exc.message}", code=exc.code
            ) from exc


class RoutinesHost:
    """Owns the ticker and the schedule multiplexer of one daemon."""

    def __init__(
        self,
        store: Store,
        scheduler: Scheduler,
        clock: Clock,
        host: HostLoop,
        config: Config,
    ) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.ticker = Ticker(
            store, scheduler, clock, owner=scheduler.options.owner,
            claim_ahead_ms=_claim_ahead_ms(config),
            on_fired=host.wake, on_resumed=host.run_resumed, key_for=binding_keys(config),
        )  # fmt: skip
        self.source = ConduitRoutineSource(
            store, clock, bindings=_binding_scopes(config), scopes=set(config.scopes),
            on_change=self.ticker.poke,
        )  # fmt: skip
        # A fired Work's Routine re-arms as soon as its attempt ends, not at the ticker's next
        # recheck of running fires (up to 5 s later, which coalesced an every-second Routine).
        host.add_attempt_listener(self._attempt_ended)
        crontab = CrontabSource()
        # Packages add sources of their own (observe-only or managed) through a plugin hook.
        extra = scheduler.plugins.schedule_sources(reserved=(self.source.name, crontab.name))
        self.schedules = ScheduleMultiplexer([self.source, crontab, *extra])

    def _attempt_ended(self, claim: Claim) -> None:
        routine_id = fired_by(claim.work)
        if routine_id is not None:
            self.ticker.fire_ended(routine_id)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Reconcile ``[[routines]]`` into the ledger, then tick until cancelled."""
        # reconcile_routines logs what it changed (once); nothing more to say here.
        await reconcile_routines(self.store, self.config, self.clock)
        await self.ticker.run(task_status=task_status)

    async def reload(self, config: Config, scheduler: Scheduler) -> None:
        """New fires feed the new scheduler; the ledger follows the new config."""
        self.config = config
        self.ticker.target = scheduler
        self.ticker.key_for = binding_keys(config)
        self.ticker.claim_ahead_ms = _claim_ahead_ms(config)
        self.source.bindings = _binding_scopes(config)
        self.source.scopes = set(config.scopes)
        await reconcile_routines(self.store, config, self.clock)
        self.ticker.poke()


def _claim_ahead_ms(config: Config) -> int:
    return round(config.settings.routine_claim_ahead_seconds * 1000)


def binding_keys(config: Config) -> KeyFor:
    """A fire's key by its binding's templates in ``config`` (docs/routines.md, "Dedup and
    debounce keys")."""

    def key_for(binding: str, payload: Any) -> SubmitKey | None:
        found = config.bindings.get(binding)
        return None if found is None else binding_key(found, payload)

    return key_for


def _binding_scopes(config: Config) -> dict[str, str]:
    return {name: binding.scope for name, binding in config.bindings.items()}
