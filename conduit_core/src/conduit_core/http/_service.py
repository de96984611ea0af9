"""What the API does, independent of HTTP: the daemon serves it, the CLI calls it directly when
no daemon runs (``work list``/``show`` on the store).

Every write is followed by ``host.wake()`` so the host loop's next pass starts at once; a
submit without a debounce by ``host.work_ready()``, a claim for the new Work without a pass.
"""

from __future__ import annotations

import logging
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from conduit_core._version import __version__
from conduit_core.config import Config
from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.http._bulk import BulkRequest, BulkResult, run_bulk
from conduit_core.http._daemons import DaemonList, DrainView, drain, list_daemons, missing_labels
from conduit_core.http._history import CANCELLED, INTERRUPTED, HistoryPage, build_history, page_of
from conduit_core.http._ids import new_work_id
from conduit_core.http._output import OutputTail
from conduit_core.http._schemas import (
    MAX_BATCH_ITEMS,
    BatchItemResult,
    BatchSubmitRequest,
    BatchSubmitResult,
    CancelRequest,
    CapacityView,
    ConfirmStoppedRequest,
    EventView,
    Health,
    InputRequest,
    InputView,
    InterruptRequest,
    KeyCapacity,
    PoolCapacity,
    ProgramView,
    RetryRequest,
    ScopeCapacity,
    SubmitRequest,
    Waiting,
    WorkDetail,
    WorkPage,
    attempt_view,
    work_view,
)
from conduit_core.http._search import WorkFilter, decode_cursor, encode_cursor
from conduit_core.http._submit_keys import submit_key_for
from conduit_core.model import (
    Dependencies,
    DependencyFailure,
    Event,
    Execution,
    Work,
    WorkStatus,
)
from conduit_core.runtime import JOBS_POOL, Scheduler
from conduit_core.storage import Claim, Store

__all__ = [
    "ApiService",
    "GLOBAL_POOL",
    "HostHooks",
    "NoHost",
    "dependency_waiting",
    "new_work_id",
]

log = logging.getLogger("conduit.api")

#: The most concurrency keys ``/v1/capacity`` lists (those with the most Work waiting).
KEYS_SHOWN = 100

#: The name capacity reports for executors without a pool (``settings.concurrency``).
GLOBAL_POOL = "global"
MAX_PAGE = 500
#: Rows one page filtered by an input key reads at most (see ``storage/_work_search``).
INPUT_SCAN = 5_000


class HostHooks(Protocol):
    """What the API needs from a running host loop (the daemon); :class:`NoHost` without one."""

    stopping: bool
    #: Draining: claims nothing new, stops once its running attempts have ended.
    draining: bool

    def wake(self) -> None:
        """A write happened: run a pass now (and tell other daemons sharing the store)."""

    def work_ready(self) -> None:
        """Work was created ready to start: claim for it now (and tell other daemons), without
        a whole pass (a submit changes no timer, expiry, stop or control a pass looks at)."""

    def run_resumed(self, claims: list[Claim]) -> None:
        """Run attempts an input woke, each in its own task."""

    def forget(self, execution_ids: list[str]) -> None:
        """Stop observing attempts that were cancelled (their physical stop follows)."""

    def running_count(self) -> int: ...

    #: Whether the host's passes stop ended attempts (the API then never waits on an executor).
    stops_ended_attempts: bool

    def stop_state(self, execution_id: str) -> str | None:
        """Where the host's stop of this ended attempt is: under way, or why it failed last."""

    def drain(self) -> None:
        """Claim nothing new, let the running attempts finish, then stop."""


@dataclass
class NoHost:
    """The CLI's direct mode: no loop to wake; a daemon finds the writes on its next rescan."""

    stopping: bool = False
    draining: bool = False
    pending_resumed: list[Claim] = field(default_factory=list)

    def wake(self) -> None:
        return None

    def work_ready(self) -> None:
        return None

    def run_resumed(self, claims: list[Claim]) -> None:
        # Without a host the resumed attempts' leases lapse and a daemon recovers them.
        self.pending_resumed.extend(claims)

    def forget(self, execution_ids: list[str]) -> None:
        return None

    def running_count(self) -> int:
        return 0

    stops_ended_attempts: bool = False

    def stop_state(self, execution_id: str) -> str | None:
        return None

    def drain(self) -> None:
        raise ConduitError(
            "no daemon runs for this config: there is nothing to drain", code="daemon_not_running"
        )


class ApiService:
    """The API's operations over the current config and scheduler (both replaced on reload)."""

    def __init__(self, config: Config, scheduler: Scheduler, host: HostHooks | None = None):
        self.config = config
        self.scheduler = scheduler
        self.host: HostHooks = host or NoHost()

    @property
    def store(self) -> Store:
        return self.scheduler.store

    def _now(self) -> int:
        return self.scheduler.clock.now_ms()

    # --- reads -----------------------------------------------------------------------------

    async def list_work(
        self, filters: WorkFilter | None = None, *, limit: int = 100, after: str | None = None
    ) -> WorkPage:
        """Work matching ``filters``, newest first unless ``order=oldest``, in keyset pages
        (``after``: the previous page's ``next``); see ``http/_search``."""
        query = (filters or WorkFilter()).resolve(self._now())
        cursor = None if after is None else decode_cursor(after)
        items, nxt = await self.store.search_work(
            query, limit=max(1, min(limit, MAX_PAGE)), after=cursor, scan_limit=INPUT_SCAN
        )
        return WorkPage(items=[work_view(w) for w in items], next=encode_cursor(nxt),
                        partial=query.input_key is not None and nxt is not None
                        and len(items) < limit)  # fmt: skip

    async def bulk(
        self, action: str, req: BulkRequest, *, actor: str | None = None
    ) -> BulkResult:
        """``cancel``, ``retry``, ``approve`` or ``refuse`` many Work, each alone (``_bulk``)."""
        return await run_bulk(self, action, req, actor=actor)

    async def show(self, work_id: str) -> WorkDetail:
        work = await self.store.get_work(work_id)
        attempts = await self.store.list_executions(work_id)
        holds = await self.store.list_holds(work_id)
        return WorkDetail(
            work=work_view(work),
            attempts=[attempt_view(a) for a in attempts],
            holds=holds,
            waiting=blocked_by_attempt(attempts, self.host.stop_state)
            or await self._waiting(work, holds),
        )

    async def inputs(self, work_id: str, *, limit: int = 20) -> list[InputView]:
        """The Work's latest ``limit`` inputs: those its attempts consumed, then the pending."""
        await self.store.get_work(work_id)  # an unknown id is a coded 404, not an empty list
        consumed = [
            (ex.attempt, event_id)
            for ex in await self.store.list_executions(work_id)
            for event_id in ex.inputs
        ]
        views: list[InputView] = []
        for attempt, event_id in consumed[-limit:]:
            try:
                event = await self.store.get_event(event_id)
            except LookupError:
                continue  # dropped after it was consumed: nothing left to show
            views.append(_input_view(event, attempt=attempt))
        pending = await self.store.pending_inputs(work_id)
        views.extend(_input_view(event, pending=True) for event in pending[:limit])
        return views

    async def history(
        self, work_id: str, *, limit: int = 100, after: str | None = None, newest: bool = False
    ) -> HistoryPage:
        """What happened to the Work, from what the store records (see ``http/_history``)."""
        work = await self.store.get_work(work_id)
        executions = await self.store.list_executions(work_id)
        events = await self.store.work_events(work_id)
        entries = build_history(work, executions, events)
        return page_of(work_id, entries, limit=limit, after=after, newest=newest)

    async def output(self, work_id: str, attempt: int, stream: str, tail: int) -> OutputTail:
        """The last ``tail`` bytes of attempt ``attempt``'s ``stream`` (its executor's)."""
        await self.store.get_work(work_id)
        found = [e for e in await self.store.list_executions(work_id) if e.attempt == attempt]
        if not found:
            raise NotFoundError("attempt", f"{work_id}#{attempt}")
        ex = found[0]
        snap = ex.snapshot
        view = OutputTail(work_id=work_id, attempt=attempt, epoch=ex.epoch, stream=stream,
                          running=not ex.status.terminal, available=False)  # fmt: skip
        try:
            executor = self.scheduler.plugins.executor(snap.executor, snap.executor_generation)
            data = await executor.output_tail(self.scheduler.stops.target(ex), stream, tail)
        except ConduitError as exc:
            return msgspec.structs.replace(view, note=f"[{exc.code}] {exc.message}")
        if data is None:
            note = f"executor {snap.executor!r} keeps no {stream} for this attempt"
            return msgspec.structs.replace(view, note=note)
        text = data.decode("utf-8", errors="replace")
        return msgspec.structs.replace(view, available=True, text=text, bytes=len(data))

    async def _record(self, work: Work, kind: str, reason: str, actor: str | None) -> None:
        """An audit record addressed to the Work (its history, never its input), written after
        the action it records: the action is done either way, so a failed write is logged, not
        answered as the action's failure."""
        now = self._now()
        key = f"{kind}/{work.id}/{work.last_attempt}/{now}/{secrets.token_hex(4)}"
        try:
            await self.store.accept_event(Event(
                id=key, delivery_id=key, type=kind,
                payload={"work": work.id, "reason": reason, **({"actor": actor} if actor else {})},
                work_id=work.id, scope=work.scope, pending=False, accepted_at_ms=now,
            ))  # fmt: skip
        except ConduitError as exc:
            log.warning("history record %s of work=%s not written: [%s] %s reason=%r",
                        kind, work.id, exc.code, exc.message, reason)  # fmt: skip

    async def _waiting(self, work: Work, holds: list[Any]) -> Waiting | None:
        if work.status is WorkStatus.HELD and holds:
            hold = holds[0]
            return Waiting(code=f"hold_{hold.kind}", message=hold.reason, limit_name=hold.holder)
        if work.status is not WorkStatus.READY:
            return None
        if (deps := dependency_waiting(work)) is not None:
            return deps
        if work.retry_timer_id is not None:
            return Waiting(code="retry_backoff", message="waiting for its retry delay")
        if work.debounce is not None:
            cap = work.debounce.deadline_ms
            return Waiting(
                code="debounced",
                message=f"debounced on {work.dedup_key!r}: starts at {work.debounce.due_ms} ms "
                "unless another submit with the key pushes it"
                + ("" if cap is None else f" (never past {cap} ms)"),
            )
        if work.blocked_reason is not None:
            return Waiting(
                code=work.blocked_reason,
                message=f"blocked ({work.blocked_reason}): `conduit work retry {work.id}`",
            )
        if work.pending_inputs <= 0:
            return None  # idle until its next input: not waiting for a slot
        if (unstartable := self._unstartable(work)) is not None:
            return unstartable
        missing = await missing_labels(self, work)
        if missing is not None:
            return Waiting(
                code="waiting_label",
                message=f"waiting for label {', '.join(missing)}: no live daemon has "
                f"{'it' if len(missing) == 1 else 'them all'}",
                limit_name=f"label:{','.join(missing)}",
            )
        refusal = await self.store.capacity_refusal(self.scheduler.capacity(), work)
        if refusal is None:
            return None
        return Waiting(code=refusal.code, message=refusal.message, limit_name=refusal.limit_name)

    def _unstartable(self, work: Work) -> Waiting | None:
        """Why this daemon starts no Work of ``work``'s binding, if it does not: the binding is
        not in its config, or its executor is not loaded here. Its claims read no such Work
        (``_ready_reads.capacity_sized``): it waits for a daemon that has the binding."""
        opts = self.scheduler.options
        binding = opts.bindings.get(work.binding)
        if binding is None:
            return Waiting(
                code="unknown_binding",
                message=f"binding {work.binding!r} is not in this daemon's config: it starts "
                "none of its Work (cancel it, or run a daemon whose config has the binding)",
            )
        if work.binding not in opts.binding_pools:
            return Waiting(
                code="unknown_executor",
                message=f"executor {binding.executor!r} of binding {work.binding!r} is not "
                "loaded in this daemon: it starts none of its Work (`conduit plugins` lists "
                "what is installed)",
            )
        return None

    async def capacity(self) -> CapacityView:
        opts = self.scheduler.options
        held: list[Execution] = [
            *await self.store.live_executions(),
            *await self.store.unconfirmed_exclusions(),
        ]
        seen: set[str] = set()
        by_pool: Counter[str] = Counter()
        by_scope: Counter[str] = Counter()
        for ex in held:
            if ex.id in seen:
                continue
            seen.add(ex.id)
            by_pool[ex.snapshot.pool or GLOBAL_POOL] += 1
            for scope in opts.scope_chain(ex.scope):
                by_scope[scope] += 1
        at_ms = self._now()
        waiting = await self.store.capacity_waiting(self.scheduler.capacity())
        limits: dict[str, int | None] = {
            **opts.pool_limits,  # [pools.NAME], whichever executor (in process or not) uses it
            GLOBAL_POOL: opts.concurrency,
            JOBS_POOL: opts.job_concurrency,
        }
        for info in self.scheduler.plugins.executors():
            if info.pool is not None:
                limits.setdefault(info.pool, None)
        for pool in by_pool:
            limits.setdefault(pool, None)
        pools = [
            PoolCapacity(name=name, limit=limit, in_use=by_pool[name], waiting=waiting.get(name, 0))
            for name, limit in sorted(limits.items())
        ]
        scopes = [
            ScopeCapacity(
                name=name,
                limit=limit,
                in_use=by_scope[name],
                waiting=waiting.get(f"scope:{name}", 0),
            )
            for name, limit in sorted(opts.scope_limits.items())
        ]
        held_keys = await self.store.key_waiting()
        keys = [KeyCapacity(name=k.key, limit=k.limit, in_use=k.in_use, waiting=k.waiting)
                for k in held_keys[:KEYS_SHOWN]]  # fmt: skip
        return CapacityView(
            pools=pools,
            scopes=scopes,
            keys=keys,
            keys_waiting=sum(k.waiting for k in held_keys),
            waiting_at_ms=at_ms,
        )

    async def health(self) -> Health:
        latest = await self.store.latest_config_generation()  # proves the store answers
        return Health(
            status=(
                "stopping" if self.host.stopping else "draining" if self.host.draining else "ok"
            ),
            version=__version__,
            owner=self.scheduler.options.owner,
            store=self.store.url,
            config_generation=(
                self.scheduler.options.config_generation if latest is None else latest.generation
            ),
            running_attempts=self.host.running_count(),
            stopping=self.host.stopping,
            draining=self.host.draining,
            labels=sorted(self.scheduler.options.labels),
            ready_depth=await self.store.ready_depth(),
            programs=[
                msgspec.convert(supervisor.state(), ProgramView)
                for supervisor in self.scheduler.plugins.programs()
            ],
        )

    async def daemons(self) -> DaemonList:
        """The daemons on the store (``GET /v1/daemons``)."""
        return await list_daemons(self)

    async def drain(self) -> DrainView:
        """Drain the daemon this service runs in (``POST /v1/daemon/drain``)."""
        return await drain(self)

    # --- writes ----------------------------------------------------------------------------

    async def submit(self, req: SubmitRequest, *, actor: str | None = None) -> WorkDetail:
        """Create the Work; ``actor`` (here and in every write below): the name of the token
        that asked, recorded on what the write stores (its first input here)."""
        work, first = self._new_work(req, self._now(), actor)
        key = submit_key_for(req, self.config.bindings[req.binding])
        if key is None:
            await self.scheduler.submit(work, first)
        else:
            work, deduplicated = await self.scheduler.submit_keyed(work, key, first)
            if deduplicated:
                log.info("work deduplicated work=%s key=%s", work.id, key.key)
                return msgspec.structs.replace(await self.show(work.id), deduplicated=True)
        log.info("work submitted work=%s binding=%s scope=%s", work.id, work.binding, work.scope)
        self._created(debounced=key is not None and key.debounced)
        return await self.show(work.id)

    def _created(self, *, debounced: bool) -> None:
        """Tell the host loop Work was created: a claim for it, or a whole pass after a
        debounced submit (its start is a timer the pass must see to sleep no longer than it)."""
        if debounced:
            self.host.wake()
        else:
            self.host.work_ready()

    async def submit_batch(
        self, req: BatchSubmitRequest, *, actor: str | None = None
    ) -> BatchSubmitResult:
        """Each item is decided alone (created, or refused with its own code), all in one store
        transaction: a producer's batch is many independent jobs, and one taken id or unknown
        binding must not send the other 999 back. A request over :data:`MAX_BATCH_ITEMS` items,
        or one the store cannot take (an outage), is refused whole and stores nothing."""
        if len(req.items) > MAX_BATCH_ITEMS:
            raise ConduitError(
                f"a batch takes at most {MAX_BATCH_ITEMS} items, this one has {len(req.items)}; "
                "split it",
                code="too_many_items",
            )
        now = self._now()
        outcomes: list[BatchItemResult | None] = []
        valid: list[tuple[Work, Event | None]] = []
        debounced = False
        for index, item in enumerate(req.items):
            try:
                work, first = self._new_work(item, now, actor)
                key = submit_key_for(item, self.config.bindings[item.binding])
                if key is not None:
                    debounced = debounced or key.debounced
                    # Keyed items decide on their key's row, one by one (docs/dedup.md).
                    held, deduplicated = await self.scheduler.submit_keyed(work, key, first)
                    outcomes.append(BatchItemResult(
                        index=index, id=held.id, created=not deduplicated,
                        deduplicated=deduplicated,
                    ))  # fmt: skip
                    continue
            except ConduitError as exc:
                outcomes.append(_refused(index, item.id, exc))
                continue
            outcomes.append(None)
            valid.append((work, first))
        stored = await self.scheduler.submit_many(valid) if valid else []
        decided = iter(zip(valid, stored, strict=True))
        results: list[BatchItemResult] = []
        for index, outcome in enumerate(outcomes):
            if outcome is None:
                (work, _), created = next(decided)
                if isinstance(created, ConduitError):
                    outcome = _refused(index, work.id, created)
                else:
                    outcome = BatchItemResult(index=index, id=work.id, created=True)
            results.append(outcome)
        made = sum(r.created for r in results)
        joined = sum(r.deduplicated for r in results)
        refused = len(results) - made - joined
        log.info("work submitted in bulk: %d created, %d deduplicated, %d refused",
                 made, joined, refused)  # fmt: skip
        if made:
            self._created(debounced=debounced)
        return BatchSubmitResult(items=results, created=made, refused=refused, deduplicated=joined)

    def _new_work(
        self, req: SubmitRequest, now: int, actor: str | None = None
    ) -> tuple[Work, Event]:
        """The Work and first input a submit asks for, or the config's refusal."""
        binding = self.config.bindings.get(req.binding)
        if binding is None:
            known = ", ".join(sorted(self.config.bindings)) or "none"
            raise ConduitError(
                f"unknown binding {req.binding!r} (configured: {known})", code="unknown_binding"
            )
        scope = req.scope or binding.scope
        if scope not in self.config.scopes:
            known = ", ".join(sorted(self.config.scopes))
            raise ConduitError(
                f"unknown scope {scope!r} (configured: {known})", code="unknown_scope"
            )
        work_id = req.id or new_work_id(now)
        dependencies = None
        if req.after:
            dependencies = Dependencies(
                after=list(dict.fromkeys(req.after)),
                on_failure=req.on_dependency_failure
                or DependencyFailure(binding.on_dependency_failure),
            )
        work = Work(
            id=work_id,
            scope=scope,
            binding=req.binding,
            kind=req.kind,
            created_at_ms=now,
            updated_at_ms=now,
            priority=binding.priority if req.priority is None else req.priority,
            dependencies=dependencies,
        )
        first = Event(
            id=f"{work_id}/input/1",
            delivery_id=f"{work_id}/input/1",
            type="core.input",
            payload=req.input,
            work_id=work_id,
            scope=scope,
            pending=True,
            accepted_at_ms=now,
            actor=actor,
        )
        return work, first

    def _event(self, work_id: str, req: InputRequest, actor: str | None) -> Event:
        now = self._now()
        delivery = req.delivery_id or f"{work_id}/input/{now}/{secrets.token_hex(4)}"
        return Event(
            id=f"{work_id}/{delivery}" if req.delivery_id else delivery,
            delivery_id=delivery,
            type=req.type,
            payload=req.payload,
            work_id=work_id,
            correlation_key=req.correlation_key,
            pending=True,
            accepted_at_ms=now,
            actor=actor,
        )

    async def send_input(
        self, work_id: str, req: InputRequest, *, actor: str | None = None
    ) -> EventView:
        work = await self.store.get_work(work_id)
        if work.status.terminal:
            raise ConduitError(f"work {work_id!r} is {work.status}", code="not_eligible")
        stored, resumed = await self.scheduler.accept_input(self._event(work_id, req, actor))
        if resumed:
            self.host.run_resumed(resumed)
        self.host.wake()
        return _event_view(stored, resumed=[c.execution.id for c in resumed])

    async def inject(
        self, work_id: str, req: InputRequest, *, actor: str | None = None
    ) -> EventView:
        """Deliver input to the running attempt (a control); queued as input if none takes it."""
        work = await self.store.get_work(work_id)
        if work.status.terminal:
            raise ConduitError(f"work {work_id!r} is {work.status}", code="not_eligible")
        stored, intent = await self.scheduler.inject(
            work_id, req.payload, delivery_id=req.delivery_id, event_type=req.type,
            correlation_key=req.correlation_key, actor=actor,
        )  # fmt: skip
        self.host.wake()
        return _event_view(stored, control_id=intent.id if intent is not None else None)

    async def cancel(
        self, work_id: str, req: CancelRequest, *, actor: str | None = None
    ) -> WorkDetail:
        """Cancel atomically; the scheduler then stops (verified) what the attempts started."""
        work = await self.store.get_work(work_id)
        if work.status.terminal:
            raise ConduitError(f"work {work_id!r} is already {work.status}", code="not_eligible")
        live = [a.id for a in await self.store.list_executions(work_id) if not a.status.terminal]
        # With a host, its next pass stops what ran, off this request (invariant 12).
        await self.scheduler.cancel_work(
            work_id, stop=not self.host.stops_ended_attempts, actor=actor
        )
        self.host.forget(live)
        await self._record(work, CANCELLED, req.reason, actor)
        log.info(
            "work cancelled work=%s attempts=%s reason=%r actor=%s", work_id,
            ",".join(live) or "-", req.reason, actor or "-",
        )  # fmt: skip
        self.host.wake()
        return await self.show(work_id)

    async def retry(
        self, work_id: str, req: RetryRequest, *, actor: str | None = None
    ) -> WorkDetail:
        work = await self.store.get_work(work_id)
        if work.status is not WorkStatus.READY:
            raise ConduitError(
                f"work {work_id!r} is {work.status}: only ready Work (failed and waiting for its "
                "retry, or blocked) can be retried",
                code="not_eligible",
            )
        await self.scheduler.manual_retry(work_id, reason=req.reason, actor=actor)
        log.info("manual retry work=%s actor=%s", work_id, actor or "-")
        self.host.wake()
        return await self.show(work_id)

    async def confirm_stopped(
        self, work_id: str, req: ConfirmStoppedRequest, *, actor: str | None = None
    ) -> WorkDetail:
        """A person's audited confirmation that the held attempt no longer runs (its epoch)."""
        by = req.by or actor or "api"
        done = await self.scheduler.confirm_stopped(
            work_id, req.epoch, by=by, reason=req.reason, actor=actor
        )
        log.warning(
            "stop confirmed work=%s execution=%s epoch=%s by=%r reason=%r actor=%s",
            work_id, done.id, req.epoch, by, req.reason, actor or "-",
        )  # fmt: skip
        self.host.wake()
        return await self.show(work_id)

    async def interrupt(
        self, work_id: str, req: InterruptRequest, *, actor: str | None = None
    ) -> WorkDetail:
        work = await self.store.get_work(work_id)
        live = [a for a in await self.store.list_executions(work_id) if a.status.live]
        if work.status.terminal or not live:
            raise ConduitError(
                f"work {work_id!r} has no running attempt to interrupt", code="not_running"
            )
        await self.scheduler.interrupt(work_id, actor=actor)
        await self._record(work, INTERRUPTED, req.reason, actor)
        log.info(
            "interrupt requested work=%s execution=%s actor=%s", work_id, live[-1].id, actor or "-"
        )
        self.host.wake()
        return await self.show(work_id)


def blocked_by_attempt(
    attempts: list[Execution], stop_state: Callable[[str], str | None] = lambda _: None
) -> Waiting | None:
    """A held recovery, or an ended attempt whose stop is unconfirmed: no new attempt starts
    (with where the host's stop of it is: under way, or why it failed last)."""
    for ex in reversed(attempts):
        if ex.status.live and ex.recovery_hold is not None:
            hold = ex.recovery_hold
            return Waiting(
                code="recovery_held",
                message=f"attempt {ex.id} is held ({hold.code}): {hold.message}; "
                f"settle: {hold.settle}",
            )
        if ex.status.terminal and not ex.exclusion_confirmed:
            stopping = stop_state(ex.id)
            return Waiting(
                code="stop_unconfirmed",
                message=f"attempt {ex.id} ended but its stop is not verified, so no new "
                "attempt starts; conduit retries the stop, or, once you know it no longer "
                f"runs: conduit work confirm-stopped {ex.work_id} --epoch {ex.epoch}"
                + (f"; stop: {stopping}" if stopping else ""),
            )
    return None


def _input_view(event: Event, *, attempt: int | None = None, pending: bool = False) -> InputView:
    return InputView(
        id=event.id, type=event.type, seq=event.seq, accepted_at_ms=event.accepted_at_ms,
        payload=event.payload, correlation_key=event.correlation_key, attempt=attempt,
        pending=pending, actor=event.actor,
    )  # fmt: skip


def _event_view(
    event: Event, *, resumed: list[str] | None = None, control_id: str | None = None
) -> EventView:
    return EventView(
        id=event.id,
        type=event.type,
        work_id=event.work_id,
        seq=event.seq,
        accepted_at_ms=event.accepted_at_ms,
        resumed=resumed or [],
        control_id=control_id,
        actor=event.actor,
    )


def _refused(index: int, work_id: str | None, exc: ConduitError) -> BatchItemResult:
    return BatchItemResult(index=index, id=work_id, created=False, error=exc.message, code=exc.code)


def dependency_waiting(work: Work) -> Waiting | None:
    """What ready Work waits for among its dependencies (``after``): those not ended yet, or
    the one whose failure blocked it (``on_dependency_failure = "hold"``)."""
    deps = work.dependencies
    if deps is None:
        return None
    if deps.waiting_for:
        return Waiting(
            code="dependency",
            message=f"waiting for work {', '.join(deps.waiting_for)}",
            limit_name=deps.waiting_for[0],
        )
    if work.blocked_reason == "dependency_failed" and deps.failed is not None:
        return Waiting(
            code="dependency_failed",
            message=f"work {deps.failed} did not complete: `conduit work retry {work.id}` runs "
            f"it anyway, `conduit work cancel {work.id}` ends it",
            limit_name=deps.failed,
        )
    return None
