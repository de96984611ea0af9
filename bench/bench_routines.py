"""Routine ticker benchmark: fire lateness with 100,000 Routines, and CPU while nothing is due.

100,000 Routines are bulk-inserted; 1,000 of them are due in the same second. A real ticker
(system clock) sleeps until that second, claims and fires them. A Routine's lateness is the
instant the claim transaction that claimed it committed (the store call returned) minus its
scheduled time; with ``--claim-batch`` below 1,000 each batch has its own instant. ``--rounds``
re-arms the same 1,000 at a later second and measures again (percentiles over all rounds).
With ``--attempts`` the fired Work go to a real ``Scheduler`` instead, whose attempts run the test
plugin's in-process ``echo`` executor (installed by ``CONDUIT_TEST_PLUGINS=1 scripts/setup.sh``)
``--concurrency`` at a time, woken by each fire as the daemon is; the bench then also prints each
fired Work's *attempt start* lateness (the instant the scheduler began the attempt, after its
claim committed, minus the scheduled time). Otherwise each fired Work is completed at once. Either
way every Routine then re-arms a year ahead, and the process CPU is measured while the ticker
sleeps.

    .venv/bin/python bench/bench_routines.py [--store URL] [--idle-seconds 20] [--rounds 1]
    .venv/bin/python bench/bench_routines.py --attempts [--concurrency 64]

``--store`` should name a scratch database: the benchmark writes 100,000 rows into it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import msgspec

from conduit_core.config import Binding
from conduit_core.daemon import tune_garbage_collection
from conduit_core.model import Event, Routine, RoutineStatus, Work, WorkStatus, WorkTemplate
from conduit_core.plugins import Plugins
from conduit_core.routines import Ticker, fired_by
from conduit_core.routines.ticker import CLAIM_AHEAD_MS, CLAIM_BATCH
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock, TaskPool
from conduit_core.storage import Claim, Store, open_store

try:
    from bench_scheduler import gates_as_a_user_has_them  # type: ignore[import-not-found]
except ImportError:  # imported as bench.bench_routines from the repository root
    from bench.bench_scheduler import gates_as_a_user_has_them

TOTAL = 100_000
DUE = 1_000
YEARLY = "0 0 1 1 *"


class Created:
    """When each fired Work was created: the instant its create returned, and its own stamp
    (``created_at_ms``, the fire's clock reading: never before the scheduled second)."""

    def __init__(self) -> None:
        self.returned: dict[str, int] = {}
        self.stamped: dict[str, int] = {}

    def note(self, results: list[Work | Exception]) -> None:
        now = SystemClock().now_ms()
        for work in results:
            if isinstance(work, Work):
                self.returned[work.id] = now
                self.stamped[work.id] = work.created_at_ms

    def clear(self) -> None:
        self.returned.clear()
        self.stamped.clear()


class CompletingTarget:
    """Creates each fire's Work and completes it at once (the executor is not measured)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.fired = 0
        self.created = Created()

    async def submit(self, work, first_input=None):  # type: ignore[no-untyped-def]
        created = await self.store.create_work(work, first_input=first_input)
        self.created.note([created])
        await self.store.update_work(
            work.id,
            lambda w: msgspec.structs.replace(w, status=WorkStatus.COMPLETED),
            now_ms=SystemClock().now_ms(),
        )
        self.fired += 1
        return created

    async def submit_many(self, items):  # type: ignore[no-untyped-def]
        created = await self.store.create_works(items)
        self.created.note(created)
        now = SystemClock().now_ms()

        async def complete(work_id: str) -> None:
            await self.store.update_work(
                work_id, lambda w: msgspec.structs.replace(w, status=WorkStatus.COMPLETED),
                now_ms=now,
            )  # fmt: skip
            self.fired += 1

        async with anyio.create_task_group() as tg:
            for work in created:
                if isinstance(work, Work):
                    tg.start_soon(complete, work.id)
        return created

    async def accept_input(self, event: Event) -> tuple[Event, list[Claim]]:
        return await self.store.accept_event(event), []


class AttemptRunner:
    """The daemon's part for fired Work: a real Scheduler claims and runs their attempts.

    Each fire wakes the claim loop (the daemon's ``on_fired``); each attempt's end tells the
    ticker (``fire_ended``, as the daemon does) so its Routine re-arms at once. ``started``
    keeps, per Work, the wall-clock instant the scheduler began its attempt (its claim had
    committed).
    """

    def __init__(self, store: Store, concurrency: int) -> None:
        self.store = store
        self.concurrency = concurrency
        self.clock = SystemClock()
        gates_as_a_user_has_them()
        self.sched = Scheduler(
            store,
            self.clock,
            Plugins.load(disabled=()),
            SchedulerOptions(
                owner="bench-routines",
                concurrency=concurrency,
                bindings={"echo": Binding(executor="echo")},
            ),
        )
        self.started: dict[str, int] = {}
        #: When the last fired Work was created (its create committed).
        self.created_at = 0
        self.created = Created()
        self.completed = 0
        self.ticker: Ticker | None = None
        self._wake = anyio.Event()
        self._in_flight = 0
        # Attempts whose settlement is on its way: claimed for at once, as the daemon does
        # (Scheduler.set_settling_listener), so the claim joins the settlement's batch.
        self._settling = 0
        self.sched.set_settling_listener(self._settlement_sent)

    def _settlement_sent(self) -> None:
        self._settling += 1
        self.wake()

    def wake(self) -> None:
        self._wake.set()

    async def submit(self, work: Work, first_input: Event | None = None) -> Work:
        created = await self.sched.submit(work, first_input)
        self.created_at = self.clock.now_ms()
        self.created.note([created])
        self.wake()
        return created

    async def submit_many(self, items):  # type: ignore[no-untyped-def]
        created = await self.sched.submit_many(items)  # the ticker wakes us (on_fired) after
        self.created_at = self.clock.now_ms()
        self.created.note(created)
        return created

    async def accept_input(self, event: Event) -> tuple[Event, list[Claim]]:
        return await self.sched.accept_input(event)

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:  # type: ignore[no-untyped-def]
        async with self.sched.keeping_leases(), anyio.create_task_group() as tg:
            tasks = TaskPool(tg)  # as the daemon's host loop runs its attempts
            task_status.started()
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                while (free := self.concurrency - self._in_flight + max(self._settling, 0)) > 0:
                    claims, _ = await self.sched.claim_ready(free)
                    if not claims:
                        break
                    for claim in claims:
                        self._in_flight += 1
                        tasks.start_soon(self._attempt, claim)

    async def _attempt(self, claim: Claim) -> None:
        self.started[claim.work.id] = self.clock.now_ms()
        try:
            await self.sched.run_attempt(claim)
        finally:
            self._in_flight -= 1
            self._settling -= 1
            self.completed += 1
            self.wake()
            routine_id = fired_by(claim.work)
            if self.ticker is not None and routine_id is not None:
                self.ticker.fire_ended(routine_id)


def routines(now: int, due_at: int) -> list[Routine]:
    rows = []
    for i in range(TOTAL):
        due = i % (TOTAL // DUE) == 0
        rows.append(
            Routine(
                id=f"r{i:06d}",
                scope="root",
                target=WorkTemplate(binding="echo", scope="root"),
                cron_spec=YEARLY,
                # The due ones are armed at the same second; the rest weeks to months ahead.
                next_run_at_ms=due_at if due else now + 86_400_000 * (7 + i % 300),
                created_at_ms=now,
                updated_at_ms=now,
            )
        )
    return rows


async def rearm(store: Store, ids: list[str], due_at: int) -> None:
    """Arm the idle Routines ``ids`` at ``due_at`` (concurrent writes: the store batches them)."""

    def arm(r: Routine) -> Routine:
        assert r.status is RoutineStatus.IDLE, r.status
        return msgspec.structs.replace(r, next_run_at_ms=due_at)

    async with anyio.create_task_group() as tg:
        for routine_id in ids:
            tg.start_soon(store.apply_routine, routine_id, arm)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main(
    url: str,
    idle_seconds: float,
    lead_seconds: float,
    rounds: int,
    claim_batch: int,
    attempts: bool,
    concurrency: int,
    claim_ahead_ms: int,
) -> None:
    tune_garbage_collection()  # as `conduit daemon` runs its process (daemon/_gc.py)
    async with await open_store(url) as store:
        clock = SystemClock()
        start = clock.now_ms()
        began = time.perf_counter()
        batch = routines(start, 0)
        for offset in range(0, TOTAL, 10_000):
            await store.put_routines(
                [r for r in batch[offset : offset + 10_000] if r.next_run_at_ms]
            )
        # The due ones last, armed at a whole second shortly after registration.
        due_at = (clock.now_ms() // 1000 + 1) * 1000 + int(lead_seconds * 1000)
        await store.put_routines(
            [
                msgspec.structs.replace(r, next_run_at_ms=due_at)
                for r in batch
                if not r.next_run_at_ms
            ]
        )
        print(f"registered {TOTAL:,} routines in {time.perf_counter() - began:.1f} s ({url})")

        claimed_at: dict[str, int] = {}
        spans: list[tuple[int, int, int]] = []  # (pass began after due, took, claimed) ms
        claim_queued = store.claim_queued
        round_due = due_at

        async def timed_claim(change, *, limit, due_at_ms=None):  # type: ignore[no-untyped-def]
            began_ms = clock.now_ms()
            won = await claim_queued(change, limit=limit, due_at_ms=due_at_ms)
            now = clock.now_ms()  # this claim transaction has committed
            if won:
                spans.append((began_ms - round_due, now - began_ms, len(won)))
            for routine in won:
                claimed_at[routine.id] = now
            return won

        store.claim_queued = timed_claim  # type: ignore[method-assign]
        runner = AttemptRunner(store, concurrency) if attempts else None
        target = runner or CompletingTarget(store)
        # With --attempts the host reports each fired Work's end (fire_ended), as the daemon
        # does, so the reread of all running fires keeps the daemon's 5 s; otherwise nothing
        # reports and the reread settles the fires.
        ticker = Ticker(
            store, target, clock, running_recheck_ms=5_000 if runner else 200,
            claim_batch=claim_batch, claim_ahead_ms=claim_ahead_ms,
            on_fired=runner.wake if runner else None,
        )  # fmt: skip
        due_ids = [r.id for r in batch if not r.next_run_at_ms]
        late: list[int] = []
        made_late: list[int] = []
        start_late: list[int] = []
        async with anyio.create_task_group() as tg:
            if runner is not None:
                runner.ticker = ticker
                await tg.start(runner.run)
            await tg.start(ticker.run)
            for n in range(rounds):
                if n:  # re-arm the same 1,000 at the next whole second (lead time ahead)
                    round_due = (clock.now_ms() // 1000 + 1) * 1000 + int(lead_seconds * 1000)
                    await rearm(store, due_ids, round_due)
                    ticker.poke()
                claimed_at.clear()
                spans.clear()
                target.created.clear()
                if runner is not None:
                    runner.started.clear()
                with anyio.fail_after(lead_seconds + 60):
                    # The store is polled only once every fired Work has started: a poll reads
                    # and decodes every running Routine, load the harness must not add to the
                    # window it measures.
                    while (  # noqa: ASYNC110
                        len(claimed_at) < DUE
                        or (runner is not None and len(runner.started) < DUE)
                        or await store.running_routines()
                    ):
                        await anyio.sleep(0.05)
                rlate = [claimed_at[r] - round_due for r in claimed_at]
                late += rlate
                print(
                    f"round {n + 1}: lateness p50 {statistics.median(rlate):.0f} ms, "
                    f"p99 {pct(rlate, 0.99):.0f} ms, max {max(rlate):.0f} ms; all fired Work "
                    f"created and settled {(clock.now_ms() - round_due) / 1000:.2f} s after the "
                    "due second"
                )
                print("  claim passes (began after due ms, took ms, claimed):", spans)
                mlate = [at - round_due for at in target.created.returned.values()]
                assert len(mlate) == DUE, len(mlate)
                made_late += mlate
                early = min(target.created.stamped.values()) - round_due
                assert early >= 0, f"a fired Work was created {-early} ms before its due second"
                print(
                    f"  fired Work created (its create returned - scheduled): p50 "
                    f"{statistics.median(mlate):.0f} ms, p99 {pct(mlate, 0.99):.0f} ms, max "
                    f"{max(mlate):.0f} ms; earliest Work stamped {early} ms after the due second"
                )
                if runner is not None:
                    slate = [at - round_due for at in runner.started.values()]
                    assert len(slate) == DUE, len(slate)
                    start_late += slate
                    print(
                        f"  attempt start lateness p50 {statistics.median(slate):.0f} ms, p99 "
                        f"{pct(slate, 0.99):.0f} ms, max {max(slate):.0f} ms: all {DUE:,} fired "
                        f"Work started {max(slate) / 1000:.2f} s after the due second "
                        f"(echo executor, concurrency {concurrency})"
                    )
                    made = runner.created_at - round_due
                    print(
                        f"  of which: all {DUE:,} fired Work created {made}"
                        f" ms after the due second, first attempt started {min(slate)} ms; then "
                        f"{DUE:,} attempts started in {(max(slate) - min(slate)) / 1000:.2f} s "
                        "(the scheduler's own pace)"
                    )
            print(
                f"fire lateness over {len(late):,} fires ({rounds} rounds of {DUE:,} due "
                f"routines; that Routine's claim committed - scheduled; claim batch "
                f"{claim_batch}): p50 {statistics.median(late):.0f} ms, p99 {pct(late, 0.99):.0f} "
                f"ms, max {max(late):.0f} ms; {len(late):,} fired Work (claim ahead "
                f"{claim_ahead_ms} ms)"
            )
            print(
                f"fired Work created over {len(made_late):,} fires (its create returned - "
                f"scheduled): p50 {statistics.median(made_late):.0f} ms, p99 "
                f"{pct(made_late, 0.99):.0f} ms, max {max(made_late):.0f} ms"
            )
            if start_late:
                print(
                    f"attempt start lateness over {len(start_late):,} fired Work (the scheduler "
                    f"began the attempt - scheduled): p50 {statistics.median(start_late):.0f} ms, "
                    f"p99 {pct(start_late, 0.99):.0f} ms, max {max(start_late):.0f} ms"
                )
            armed = await store.next_due_at()
            assert armed is not None
            assert armed > clock.now_ms() + 86_400_000, armed
            await anyio.sleep(0.5)  # let the last re-arm settle
            ticks, cpu0, wall0 = ticker.ticks, time.process_time(), time.perf_counter()
            await anyio.sleep(idle_seconds)
            cpu = time.process_time() - cpu0
            wall = time.perf_counter() - wall0
            print(
                f"idle: {cpu * 1000:.1f} ms CPU over {wall:.1f} s ({cpu / wall * 100:.3f} %), "
                f"{ticker.ticks - ticks} ticks (timer armed {ticker.armed_ms} ms, 60 s clamp)"
            )
            tg.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="store URL (default: a fresh SQLite file)")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--lead-seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=1, help="due seconds to measure")
    parser.add_argument("--claim-batch", type=int, default=CLAIM_BATCH, help="rows per claim")
    parser.add_argument(
        "--attempts", action="store_true", help="run fired Work through a real Scheduler (echo)"
    )
    parser.add_argument("--concurrency", type=int, default=64, help="attempts at once")
    parser.add_argument(
        "--claim-ahead-ms", type=int, default=CLAIM_AHEAD_MS,
        help="claim rows due this soon before their instant (0: at the instant, as before)",
    )  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store_url = args.store or f"sqlite://{Path(tmp) / 'bench.db'}"
        anyio.run(
            main,
            store_url,
            args.idle_seconds,
            args.lead_seconds,
            args.rounds,
            args.claim_batch,
            args.attempts,
            args.concurrency,
            args.claim_ahead_ms,
        )
