"""The ticker: the actuator of the Routine ledger. It holds no durable state.

One timer, armed at ``min(max(next_due - claim_ahead - now, 0), 60 s)``. Each tick: the
due-pass (in SQL), atomic claims of queued rows (a lost claim is dropped, never retried), the
claimed fires dispatched concurrently (the tick never waits for them), the settle pass over
``running`` rows whose Work finished, then re-arm. :meth:`Ticker.poke` re-arms at once (any
write to a Routine pokes). The 60-second clamp is the rescan that picks up rows other processes
wrote.

Claim ahead: a row due within ``claim_ahead_ms`` is claimed before its due instant, so the claim
transaction (tens to hundreds of ms for a thousand rows under load) is paid before that instant;
its fire still waits for the instant (a fire's Work never exists before its scheduled time), then
re-reads the claimed rows and drops those no longer claimed under its token (deleted meanwhile).
A claim taken ahead is an ordinary claim: leased and fenced, refused to pause/edit as ``busy``,
given back (claimed -> queued) if the ticker is stopped before the instant, healed by any daemon
once its lease expires if the ticker dies.

At start, boot-resume heals the rows whose claim lease EXPIRED (claimed -> queued, recurring
running -> idle, one-shot running -> error); live leases belong to other daemons and are left
alone. A daemon renews the claims of its own running fires every tick.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable

import anyio
from anyio.abc import TaskGroup, TaskStatus

from conduit_core.errors import ConduitError
from conduit_core.model import Routine, RoutineStatus
from conduit_core.routines import ledger
from conduit_core.routines.fire import (
    FireTarget,
    KeyFor,
    OnResumed,
    fire_claimed,
    fire_claimed_many,
    fire_input_id,
    settle_update,
)
from conduit_core.runtime import Clock
from conduit_core.storage import RoutineUpdate, Store

__all__ = ["Ticker"]

log = logging.getLogger("conduit.routines")

#: The rescan clamp: the ticker never sleeps longer than this.
MAX_SLEEP_MS = 60_000
#: A claim lease; renewed every tick (at most every MAX_SLEEP_MS) by its owner.
CLAIM_LEASE_MS = 5 * 60_000
#: Rows per claim transaction; each batch's fires are dispatched as its claim commits.
CLAIM_BATCH = 1_000
#: Ticks a poke wakes are at least this far apart: a burst of pokes (a thousand fired attempts
#: ending) is a few ticks, not a thousand. A tick the timer wakes (a row is due) runs at once.
MIN_POKE_GAP_MS = 50
#: How long before its due instant a row is claimed (its fire still waits for the instant).
CLAIM_AHEAD_MS = 500
#: The longest single sleep while a claimed-ahead fire waits for its instant (a test's manual
#: clock is moved by hand; the system clock is simply re-read).
_WAIT_STEP_MS = 200


class Ticker:
    """``Ticker(store, target, clock).run()`` in a task group; :meth:`poke` after Routine writes.

    ``target`` is what fires feed (the daemon's :class:`~conduit_core.runtime.Scheduler`); assign
    :attr:`target` again after a reload. ``on_fired`` is called after fires created Work (the
    daemon wakes its host loop); ``on_resumed`` gets the claims of parked attempts a bound
    Routine's input woke.
    """

    def __init__(
        self,
        store: Store,
        target: FireTarget,
        clock: Clock,
        *,
        owner: str | None = None,
        lease_ms: int = CLAIM_LEASE_MS,
        max_sleep_ms: int = MAX_SLEEP_MS,
        running_recheck_ms: int = 5_000,
        claim_batch: int = CLAIM_BATCH,
        claim_ahead_ms: int = CLAIM_AHEAD_MS,
        on_fired: Callable[[], None] | None = None,
        on_resumed: OnResumed | None = None,
        key_for: KeyFor | None = None,
    ) -> None:
        self.store = store
        self.target = target
        #: The binding's dedup or debounce key of a fire's Work (assign again after a reload).
        self.key_for = key_for
        self.clock = clock
        self.owner = owner or f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
        self.lease_ms = lease_ms
        self.max_sleep_ms = max_sleep_ms
        self.running_recheck_ms = running_recheck_ms
        self.claim_batch = claim_batch
        self.claim_ahead_ms = claim_ahead_ms
        self.on_fired = on_fired
        self.on_resumed = on_resumed
        self.ticks = 0
        #: The delay the last tick armed the timer with (ms).
        self.armed_ms: int | None = None
        self._wake = anyio.Event()
        self._tg: TaskGroup | None = None
        # Routines whose fired Work ended (fire_ended); once any is reported, a tick settles
        # only those, and rereads every running fire once per running_recheck_ms.
        self._ended: set[str] = set()
        self._hinted = False
        self._swept_at: float | None = None
        self._still_running = 0

    def poke(self) -> None:
        """Re-arm now: the next tick runs at once (a Routine was written)."""
        self._wake.set()

    def fire_ended(self, routine_id: str) -> None:
        """The Work a fire of ``routine_id`` fed had an attempt end: settle that Routine at the
        next tick (the host calls this for every attempt of Work a Routine fired)."""
        self._hinted = True
        self._ended.add(routine_id)
        self._wake.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Boot-resume, then tick until cancelled. Fires run in this task's own task group."""
        await self.boot_resume()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            try:
                while True:
                    self._wake = anyio.Event()
                    began = anyio.current_time()
                    try:
                        delay_ms = await self.tick()
                    except (ConduitError, OSError) as exc:
                        log.warning("routine tick failed: %s", exc)
                        delay_ms = min(1_000, self.max_sleep_ms)
                    with anyio.move_on_after(delay_ms / 1000):
                        await self._wake.wait()
                    if self._wake.is_set():  # poked: let a burst of pokes gather
                        gap = MIN_POKE_GAP_MS / 1000 - (anyio.current_time() - began)
                        if gap > 0:
                            await anyio.sleep(gap)
            finally:
                self._tg = None

    async def boot_resume(self) -> list[Routine]:
        """Heal the rows a dead ticker left mid-fire (only expired claims)."""
        now = self.clock.now_ms()
        healed = await self.store.heal_routines(
            lambda r: ledger.heal_on_boot(r, ledger.readable_spec(r), now)
        )
        for routine in healed:
            log.info("routine %s healed on boot -> %s", routine.id, routine.status)
        return healed

    async def tick(self) -> int:
        """One pass; returns the delay (ms) until the next. Without :meth:`run`, it waits for
        the fires it dispatched (tests drive it this way)."""
        self.ticks += 1
        next_due = await self.store.next_due_at()
        if next_due is not None and next_due <= self.clock.now_ms() + self.claim_ahead_ms:
            if self._tg is not None:
                await self._claim_due(self._tg)
            else:
                async with anyio.create_task_group() as tg:
                    await self._claim_due(tg)
        running = await self.settle_running()
        delay = await self.next_delay(running)
        self.armed_ms = delay
        return delay

    async def _claim_due(self, tg: TaskGroup) -> int:
        """Claim what is due by now + :attr:`claim_ahead_ms` in batches of :attr:`claim_batch`
        (each batch one transaction that also runs the due-pass: a due row is written once),
        then dispatch the fires, each group at its due instant.

        Every claim batch commits before any fire starts: fires write to the same store, and
        dispatched between batches they queue ahead of the next claim and make it late."""
        horizon = self.clock.now_ms() + self.claim_ahead_ms
        claimed: list[Routine] = []
        while True:
            batch = await self.store.claim_queued(
                self._claim_change(self.clock.now_ms()), limit=self.claim_batch, due_at_ms=horizon
            )
            claimed += batch
            if len(batch) < self.claim_batch:
                break
            next_due = await self.store.next_due_at()  # a read: is another batch due?
            if next_due is None or next_due > horizon:
                break
        groups: dict[int, list[Routine]] = {}
        now = self.clock.now_ms()
        for routine in claimed:
            instant = routine.next_run_at_ms if routine.next_run_at_ms is not None else now
            groups.setdefault(max(instant, now), []).append(routine)
        for instant in sorted(groups):
            group = groups[instant]
            tg.start_soon(self._fire_at, instant, group, tg, name=f"fire {len(group)} routines")
        return len(claimed)

    async def _fire_at(self, instant: int, claimed: list[Routine], tg: TaskGroup) -> None:
        """Fire ``claimed`` once the clock reads ``instant`` (never before). Claimed ahead,
        the rows are re-read first: one deleted or claimed anew meanwhile is not fired."""
        if self.clock.now_ms() < instant:
            try:
                # A clock is read, not awaited: re-read it after each step until the instant.
                while (left := instant - self.clock.now_ms()) > 0:  # noqa: ASYNC110
                    await anyio.sleep(min(left, _WAIT_STEP_MS) / 1000)
            except anyio.get_cancelled_exc_class():
                with anyio.move_on_after(5, shield=True):
                    await self._give_back(claimed)
                raise
            claimed = await self._still_claimed(claimed)
            if not claimed:
                return
        await self._fire_all(claimed, tg)

    async def _still_claimed(self, claimed: list[Routine]) -> list[Routine]:
        """The rows of ``claimed`` still claimed under the token this ticker claimed them with."""
        fires = await self.store.running_fires(fire_input_id, ids=[r.id for r in claimed])
        tokens = {r.id: r.claim_token for r, _, _ in fires if r.status is RoutineStatus.CLAIMED}
        kept = [r for r in claimed if tokens.get(r.id) == r.claim_token]
        if len(kept) < len(claimed):
            lost = len(claimed) - len(kept)
            log.info("%d routines claimed ahead changed before their fire", lost)
        return kept

    async def _give_back(self, claimed: list[Routine]) -> None:
        """claimed -> queued for fires not started (the ticker stops before their instant), so
        the next ticker fires them without waiting for the claim lease to expire."""
        now = self.clock.now_ms()
        updates = [
            RoutineUpdate(r.id, self._abandon(r.claim_token, now))
            for r in claimed
            if r.claim_token is not None
        ]
        try:
            await self.store.apply_routines(updates)
        except (ConduitError, OSError) as exc:
            log.warning("claims of %d routines not given back: %s", len(updates), exc)

    def _abandon(self, token: str, now: int) -> Callable[[Routine], Routine]:
        return lambda r: ledger.abandon_claim(r, token=token, now_ms=now)

    async def _fire_all(self, claimed: list[Routine], tg: TaskGroup) -> None:
        """Fire what was claimed: the Routines that create Work in two store writes for all
        (when the target submits many), the others one by one, concurrently."""
        try:
            rest = await fire_claimed_many(
                self.store, self.target, claimed, now_ms=self.clock.now_ms(),
                on_created=self.on_fired, key_for=self.key_for,
            )  # fmt: skip
        except Exception:
            log.exception("routine fires of %d routines failed", len(claimed))
            return
        for routine in rest:
            tg.start_soon(self._fire, routine, name=f"fire {routine.id}")
        if len(rest) < len(claimed):
            self._swept_at = None  # the next tick rereads every running fire, these included
            self.poke()

    def _claim_change(self, now: int) -> Callable[[Routine], Routine]:
        def change(routine: Routine) -> Routine:
            return ledger.claim(
                routine,
                owner=self.owner,
                token=secrets.token_hex(16),
                now_ms=now,
                lease_ms=self.lease_ms,
            )

        return change

    async def _fire(self, routine: Routine) -> None:
        try:
            await fire_claimed(
                self.store,
                self.target,
                routine,
                now_ms=self.clock.now_ms(),
                on_resumed=self.on_resumed,
                key_for=self.key_for,
            )
        except Exception:
            log.exception("routine %s: fire failed", routine.id)
            return
        self._swept_at = None  # the next tick rereads every running fire, this one included
        self.poke()  # recheck soon: the running row now needs settling and renewing
        if self.on_fired is not None:
            self.on_fired()

    async def settle_running(self) -> int:
        """Settle running rows whose Work is done; renew the claims this ticker holds once a
        third of their lease has passed. One read and one write, however many are running.

        Once the host reports ended fires (:meth:`fire_ended`), only those are read, and every
        running fire is reread (and claims renewed) once per :attr:`running_recheck_ms`.
        Returns how many fires are still running (store-wide, as of the last full reread).
        """
        sweep = (
            not self._hinted
            or self._swept_at is None
            or anyio.current_time() - self._swept_at >= self.running_recheck_ms / 1000
        )
        ended, self._ended = self._ended, set()
        if not sweep and not ended:
            return self._still_running
        if sweep:
            self._swept_at = anyio.current_time()
        fires = await self.store.running_fires(fire_input_id, ids=None if sweep else sorted(ended))
        now = self.clock.now_ms()
        updates: list[RoutineUpdate] = []
        still = 0
        for routine, work, pending in fires:
            outcome = settle_update(routine, work, pending, now_ms=now)
            if outcome is not None:
                updates.append(outcome)
                continue
            still += 1
            token = routine.claim_token
            if routine.claim_owner != self.owner or token is None:
                continue
            if routine.status is RoutineStatus.CLAIMED and routine.id in ended:
                self._ended.add(routine.id)  # its Work ended before its fire was recorded
            expires = routine.claim_expires_at_ms or 0
            if sweep and expires - now <= self.lease_ms * 2 // 3:
                updates.append(RoutineUpdate(routine.id, self._renewal(token, now)))
        settled = 0
        for update, written in zip(updates, await self.store.apply_routines(updates), strict=True):
            if isinstance(written, ConduitError):
                log.info("routine %s: not settled or renewed: %s", update.routine_id, written)
            elif written.status is not RoutineStatus.RUNNING:
                settled += 1
        self._still_running = still if sweep else max(self._still_running - settled, 0)
        return self._still_running

    def _renewal(self, token: str, now: int) -> Callable[[Routine], Routine]:
        return lambda r: ledger.renew_claim(r, token=token, now_ms=now, lease_ms=self.lease_ms)

    async def next_delay(self, running: int = 0) -> int:
        """``min(max(next_due - claim_ahead - now, 0), max_sleep)``; shorter while fires are
        running."""
        cap = self.max_sleep_ms
        if running:
            cap = min(cap, self.running_recheck_ms)
        next_due = await self.store.next_due_at()
        if next_due is None:
            return cap
        return min(max(next_due - self.claim_ahead_ms - self.clock.now_ms(), 0), cap)
