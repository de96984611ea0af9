"""The executor conformance suite: every executor package runs these cases against its executor.

An executor package imports the cases into one of its test modules and provides an
``executor_subject`` fixture that describes its installed executor::

    from conduit_core.testing.executor import *  # noqa: F403
    from conduit_core.testing.executor import ExecutorSubject

    @pytest.fixture
    def executor_subject() -> ExecutorSubject:
        return ExecutorSubject(
            executor="mine",                        # the registered name (entry point installed)
            job_config=lambda script, workdir: {"command": script},
            invalid_config={"command": 42},
            live_resources=my_live_resources,       # execution id -> what still runs for it
        )

The jobs are POSIX ``sh`` scripts the suite writes (``job_config`` turns one into the binding
config that runs it); they leave their side effects in ``workdir``, which the job must be able to
write (a container executor mounts it at the same path). The executor is loaded through the
installed plugins, exactly as a daemon loads it. The cases use a real SQLite store and the real
core Scheduler; the crash cases run it in real host processes and SIGKILL them (see ``_host``).
Async cases use anyio's pytest plugin.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.to_thread
import msgspec
import pytest

from conduit_core.errors import LeaseLostError
from conduit_core.extension import (
    Capability,
    ExecutionContext,
    Executor,
    Handle,
    InputEvent,
    NotStartedError,
    OperationError,
    OutcomeKind,
    Result,
    StopEvidence,
    StopTarget,
)
from conduit_core.model import Execution, ExecutionStatus, Work, WorkStatus
from conduit_core.plugins import Plugins
from conduit_core.runtime import Attempt, ManualClock, Scheduler
from conduit_core.storage import Store, open_store
from conduit_core.testing._host import (
    BINDING,
    LAUNCH_POINTS,
    CrashPoint,
    HostArgs,
    options_for,
    programs_for,
)
from conduit_core.testing._jobs import (
    Jobs,
    RecordingCallbacks,
    host_pids_alive,
    submit,
    wait_for,
)

__all__ = [
    "CrashOutcome",
    "CrashPoint",
    "LAUNCH_POINTS",
    "ExecutorSubject",
    "Jobs",
    "crash_and_recover",
    "anyio_backend",
    "executor_world",
    "pytestmark",
    "test_crash_at_each_launch_point_runs_the_job_once",
    "test_failing_job_is_a_failed_attempt",
    "test_generation_pinning_recovers_with_the_pinned_generation",
    "test_interrupt_stops_the_running_job",
    "test_program_killed_mid_run_is_recovered_not_rerun",
    "test_invalid_config_is_permanent_and_stores_nothing",
    "test_recover_adopts_a_live_resource",
    "test_recover_that_contradicts_the_store_is_held",
    "test_recover_after_it_finished_reads_the_result",
    "test_run_returns_a_typed_result",
    "test_stop_is_verified_with_a_term_ignoring_grandchild",
    "test_writes_first_starts_nothing_before_its_first_write",
]

pytestmark = pytest.mark.anyio

#: How long any one wait of the suite may take before the case fails (loaded CI machines).
WAIT_SECONDS = 60.0
LEASE_MS = 60_000


@dataclass(frozen=True, kw_only=True)
class ExecutorSubject:
    """What the suite needs to know about the executor under test."""

    #: The executor's registered name; its package must be installed (entry point group conduit).
    executor: str
    #: The binding config that runs ``script`` (POSIX sh) with ``workdir`` writable at its path.
    job_config: Callable[[str, Path], Mapping[str, Any]]
    #: A binding config the executor must refuse as permanent ``invalid_config``.
    invalid_config: Mapping[str, Any]
    #: What still exists for an execution id (processes, containers): empty once it is settled.
    live_resources: Callable[[str], Sequence[str]]
    #: A historical generation to check pinning with (None: the current one is pinned).
    historical_generation: int | None = None
    #: The job's pids are host pids (a process executor), so the suite checks them itself too.
    host_pids: bool = True
    #: An out-of-process executor that is no Python package: its command, declared to every
    #: host the way ``[executors.NAME] command = [...]`` in conduit.toml does.
    program: Sequence[str] | None = None

    def load_plugins(self, cls: type[Plugins] = Plugins) -> Plugins:
        """The installed plugins, plus this subject's executor program when it has one."""
        return cls.load(programs=programs_for(self.executor, self.program))


class _World:
    """One SQLite store, a clock the cases move, and schedulers built on freshly loaded plugins."""

    def __init__(self, root: Path, store: Store, subject: ExecutorSubject) -> None:
        self.root = root
        self.store = store
        self.subject = subject
        self.clock = ManualClock(time.time_ns() // 1_000_000)
        self.workdir = root / "job"
        self.workdir.mkdir()
        self.jobs = Jobs(self.workdir)
        #: What each case started, stopped at teardown whatever the case's outcome.
        self._started: list[tuple[Executor, StopTarget]] = []
        self._keep: list[object] = []

    def track(self, target: StopTarget | Execution, executor: Executor | None = None) -> None:
        """Stop this at teardown (with the pinned generation's implementation by default)."""
        if isinstance(target, Execution):
            executor = executor or self.executor(target.snapshot.executor_generation)
            target = _stop_target(target, self.root / "state")
        self._started.append((executor or self.executor(), target))

    async def settle(self) -> None:
        """Stop whatever a case left running and wait until the subject sees nothing left."""
        for executor, target in self._started:
            # Also after a clean end: a stop is idempotent, and lets the executor reap children.
            with anyio.move_on_after(WAIT_SECONDS):
                await executor.stop(target)
            await wait_for(
                lambda: not self.live(target.execution_id),  # noqa: B023 - awaited here
                f"execution {target.execution_id} to leave nothing running",
                WAIT_SECONDS,
            )
        for kept in self._keep:
            if isinstance(kept, Plugins):
                await kept.close()  # shut the executor programs down (their jobs are stopped)

    def scheduler(
        self, script: str, *, generation: int | None = None, plugins: Plugins | None = None
    ) -> Scheduler:
        args = self._args(script, generation)
        plugins = plugins or self.subject.load_plugins()
        # Executors may hold their children's handles: keep them until the teardown reaped them.
        self._keep.append(plugins)
        return Scheduler(self.store, self.clock, plugins, options_for(args))

    def _args(self, script: str, generation: int | None) -> HostArgs:
        return HostArgs(
            mode="test", store=str(self.root / "conduit.db"), state_dir=str(self.root / "state"),
            work_id=f"w-{uuid.uuid4().hex[:8]}", executor=self.subject.executor,
            generation=generation, config=dict(self.subject.job_config(script, self.workdir)),
            lease_ms=LEASE_MS, program=_program(self.subject),
        )  # fmt: skip

    def context(self, script: str, callbacks: RecordingCallbacks) -> ExecutionContext:
        """A context for calling the executor directly, outside any scheduler."""
        return _context(self, dict(self.subject.job_config(script, self.workdir)), callbacks)

    def executor(self, generation: int | None = None) -> Executor:
        plugins = self.subject.load_plugins()
        self._keep.append(plugins)
        info = plugins.executor_info(self.subject.executor)
        return plugins.executor(info.name, generation or info.generation)

    async def execution(self, execution_id: str) -> Execution:
        return await self.store.get_execution(execution_id)

    def live(self, execution_id: str) -> list[str]:
        return list(self.subject.live_resources(execution_id))


def _context(
    world: _World, config: dict[str, Any], callbacks: RecordingCallbacks, *, generation: int = 0
) -> ExecutionContext:
    info = world.subject.load_plugins().executor_info(world.subject.executor)
    execution_id = f"x-{uuid.uuid4().hex[:12]}"
    return ExecutionContext(
        execution_id=execution_id, work_id=f"w-{execution_id}", attempt=1, epoch=1,
        scope="root", binding=BINDING, executor=info.name,
        generation=generation or info.generation, config=config,
        state_dir=str(world.root / "state"), callbacks=callbacks,
    )  # fmt: skip


@pytest.fixture
def anyio_backend() -> str:
    """The cases run on asyncio, the event loop the daemon runs (and out-of-process executors'
    proxies need), whatever other anyio backends happen to be installed."""
    return "asyncio"


@pytest.fixture
async def executor_world(
    tmp_path: Path, executor_subject: ExecutorSubject
) -> AsyncIterator[_World]:
    store = await open_store(tmp_path / "conduit.db")
    async with store:
        world = _World(tmp_path, store, executor_subject)
        try:
            yield world
        finally:
            await world.settle()


def _program(subject: ExecutorSubject) -> list[str] | None:
    return None if subject.program is None else list(subject.program)


def _stop_target(ex: Execution, state_root: Path) -> StopTarget:
    # As the scheduler names it (options_for gives the host ``state_root``).
    return StopTarget(
        execution_id=ex.id, epoch=ex.epoch, work_id=ex.work_id,
        config=dict(ex.snapshot.binding_config), recovery=ex.recovery,
        launch_intent=ex.launch_intent, state_dir=str(state_root / ex.snapshot.executor),
    )  # fmt: skip


def _explain(ex: Execution) -> str:
    return (
        f"execution {ex.id} epoch {ex.epoch} is {ex.status}: "
        f"{ex.failure_code or ''} {ex.failure_message or ''}".strip()
    )


async def _launch(world: _World, script: str, *, generation: int | None = None) -> Attempt:
    """Claim and launch an attempt whose host then vanishes: nobody observes or renews it."""
    sched = world.scheduler(script, generation=generation)
    work = await submit(sched, BINDING)
    launched = await sched.launch(await sched.claim(work.id))
    assert isinstance(launched, Attempt), _explain(launched)
    world.track(launched.context.stop_target(), launched.executor)
    return launched


async def _recover_in(
    world: _World, tg: Any, script: str, results: list[Execution], plugins: Plugins | None = None
) -> None:
    """A fresh scheduler recovers every expired attempt; each runs to its end in ``tg``."""
    world.clock.advance(LEASE_MS + 1_000)
    sched = world.scheduler(script, plugins=plugins)
    claims = await sched.recover_expired()
    assert claims, "the lost attempt's expired lease was not claimed for recovery"

    async def run(claim: Any) -> None:
        ex = await sched.run_recovery(claim)
        world.track(ex)
        results.append(ex)

    for claim in claims:
        tg.start_soon(run, claim)


# --- run, fail, invalid config ------------------------------------------------------------------


async def test_run_returns_a_typed_result(executor_world: _World) -> None:
    sched = executor_world.scheduler(executor_world.jobs.record())
    work = await submit(sched, BINDING)
    with anyio.fail_after(WAIT_SECONDS):
        ex = await sched.run_attempt(await sched.claim(work.id))
    executor_world.track(ex)
    assert ex.status is ExecutionStatus.COMPLETED, _explain(ex)
    assert isinstance(ex.result, Result)
    assert ex.result.outcome is OutcomeKind.COMPLETED
    assert executor_world.jobs.side_effects() == 1
    assert ex.launch_intent is not None, "the launch recorded no launch intent before starting"
    assert ex.recovery is not None
    assert ex.exclusion_confirmed
    assert executor_world.live(ex.id) == []


async def test_failing_job_is_a_failed_attempt(executor_world: _World) -> None:
    sched = executor_world.scheduler(executor_world.jobs.fail())
    work = await submit(sched, BINDING)
    with anyio.fail_after(WAIT_SECONDS):
        ex = await sched.run_attempt(await sched.claim(work.id))
    executor_world.track(ex)
    assert ex.status is ExecutionStatus.FAILED, _explain(ex)
    assert ex.result is None or ex.result.outcome is OutcomeKind.FAILED
    assert (await executor_world.store.get_work(work.id)).failure_count == 1
    assert executor_world.jobs.side_effects() == 1
    assert executor_world.live(ex.id) == []


async def test_invalid_config_is_permanent_and_stores_nothing(executor_world: _World) -> None:
    callbacks = RecordingCallbacks()
    ctx = _context(executor_world, dict(executor_world.subject.invalid_config), callbacks)
    executor = executor_world.executor()
    executor_world.track(ctx.stop_target(), executor)
    with pytest.raises(OperationError) as caught:
        await executor.run(ctx)
    assert caught.value.code == "invalid_config"
    assert caught.value.permanent
    assert callbacks.launch_intent is None
    assert callbacks.recovery is None
    assert executor_world.live(ctx.execution_id) == []


# --- stop and interrupt -------------------------------------------------------------------------


async def _started(world: _World, script: str) -> tuple[Executor, ExecutionContext, Handle]:
    executor = world.executor()
    ctx = world.context(script, RecordingCallbacks())
    handle = await executor.run(ctx)
    world.track(ctx.stop_target(), executor)
    await wait_for(world.jobs.ready, "the job to say it is ready", WAIT_SECONDS)
    return executor, ctx, handle


async def test_stop_is_verified_with_a_term_ignoring_grandchild(executor_world: _World) -> None:
    executor, ctx, _ = await _started(executor_world, executor_world.jobs.stubborn())
    pids = executor_world.jobs.pids()
    assert executor_world.live(ctx.execution_id), "live_resources sees nothing of a running job"
    if executor_world.subject.host_pids:
        assert host_pids_alive(pids) == pids  # negative control: they run before the stop
    with anyio.fail_after(WAIT_SECONDS):
        evidence = await executor.stop(ctx.stop_target())
    assert evidence.verified, evidence.detail
    assert executor_world.live(ctx.execution_id) == []
    if executor_world.subject.host_pids:
        assert host_pids_alive(pids) == []


async def test_interrupt_stops_the_running_job(executor_world: _World) -> None:
    info = executor_world.subject.load_plugins().executor_info(executor_world.subject.executor)
    if Capability.INTERRUPT not in info.capabilities:
        pytest.skip(f"executor {info.name!r} does not declare interrupt")
    executor, ctx, _ = await _started(executor_world, executor_world.jobs.until_go())
    assert executor_world.live(ctx.execution_id)
    # The core fences the attempt before it dispatches an interrupt, so what the old handle's
    # wait says afterwards is nobody's business; the evidence and the engine's view are.
    with anyio.fail_after(WAIT_SECONDS):
        evidence = await executor.interrupt(ctx.stop_target())
    assert evidence.verified, evidence.detail
    assert executor_world.live(ctx.execution_id) == []
    assert not executor_world.jobs.done()


# --- launch -------------------------------------------------------------------------------------


class _RefusingCallbacks(RecordingCallbacks):
    """Every fenced write is refused, as a lost lease refuses it; the refusals are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: list[str] = []

    def _refuse(self, what: str) -> None:
        self.refused.append(what)
        raise LeaseLostError(f"{what} refused: the lease is lost")

    async def persist_recovery(self, metadata: Mapping[str, Any]) -> None:
        self._refuse("persist_recovery")

    async def record_launch_intent(self, intent: Mapping[str, Any]) -> None:
        self._refuse("record_launch_intent")

    async def begin_phase(self, name: str) -> None:
        self._refuse(f"begin_phase({name})")

    async def pin(self, ref: str) -> None:
        self._refuse("pin")


async def test_writes_first_starts_nothing_before_its_first_write(executor_world: _World) -> None:
    """``writes_first`` is a promise the core relies on (it then writes no invoke mark of its own
    before ``run``, and a launch whose first write never landed is relaunched): ``run`` makes a
    fenced write before it starts anything, so when that write is refused nothing has started."""
    info = executor_world.subject.load_plugins().executor_info(executor_world.subject.executor)
    if Capability.WRITES_FIRST not in info.capabilities:
        pytest.skip(f"executor {info.name!r} does not declare writes_first")
    executor = executor_world.executor()
    callbacks = _RefusingCallbacks()
    ctx = executor_world.context(executor_world.jobs.record(), callbacks)
    executor_world.track(ctx.stop_target(), executor)
    with anyio.fail_after(WAIT_SECONDS), pytest.raises(LeaseLostError):
        await executor.run(ctx)
    assert len(callbacks.refused) == 1, f"run went on past its refused write: {callbacks.refused}"
    assert executor_world.live(ctx.execution_id) == [], "something started before the write"
    assert executor_world.jobs.side_effects() == 0


# --- recovery -----------------------------------------------------------------------------------


async def test_recover_adopts_a_live_resource(executor_world: _World) -> None:
    script = executor_world.jobs.until_go()
    attempt = await _launch(executor_world, script)
    await wait_for(executor_world.jobs.ready, "the job to start", WAIT_SECONDS)
    results: list[Execution] = []
    with anyio.fail_after(WAIT_SECONDS):
        async with anyio.create_task_group() as tg:
            await _recover_in(executor_world, tg, script, results)

            async def adopted() -> bool:
                ex = await executor_world.execution(attempt.execution.id)
                return ex.epoch == 2 and ex.status is ExecutionStatus.RUNNING

            await wait_for(adopted, "the recovery to adopt the running job", WAIT_SECONDS)
            # Adopted while it ran: not started again.
            assert executor_world.jobs.side_effects() == 1
            executor_world.jobs.go()
    [ex] = results
    assert ex.status is ExecutionStatus.COMPLETED, _explain(ex)
    assert not any(s.relaunched for s in ex.segments)
    assert executor_world.jobs.side_effects() == 1
    assert executor_world.live(ex.id) == []


async def test_recover_after_it_finished_reads_the_result(executor_world: _World) -> None:
    script = executor_world.jobs.record()
    attempt = await _launch(executor_world, script)
    await wait_for(executor_world.jobs.done, "the unobserved job to finish", WAIT_SECONDS)
    results: list[Execution] = []
    with anyio.fail_after(WAIT_SECONDS):
        async with anyio.create_task_group() as tg:
            await _recover_in(executor_world, tg, script, results)
    [ex] = results
    assert ex.id == attempt.execution.id
    assert ex.status is ExecutionStatus.COMPLETED, _explain(ex)
    assert isinstance(ex.result, Result)
    assert ex.result.outcome is OutcomeKind.COMPLETED
    assert executor_world.jobs.side_effects() == 1
    assert executor_world.live(ex.id) == []


class _SpyPlugins(Plugins):
    asked: list[tuple[str, int]]

    def executor(self, name: str, generation: int) -> Executor:
        self.asked.append((name, generation))
        return super().executor(name, generation)


async def test_generation_pinning_recovers_with_the_pinned_generation(
    executor_world: _World,
) -> None:
    # Without a historical generation this still checks the rule: recovery asks the plugins for
    # exactly the pinned generation, never "whatever is current".
    info = executor_world.subject.load_plugins().executor_info(executor_world.subject.executor)
    pinned = executor_world.subject.historical_generation or info.generation
    script = executor_world.jobs.until_go()
    attempt = await _launch(executor_world, script, generation=pinned)
    assert attempt.execution.snapshot.executor_generation == pinned
    await wait_for(executor_world.jobs.ready, "the job to start", WAIT_SECONDS)
    spy = cast(_SpyPlugins, executor_world.subject.load_plugins(_SpyPlugins))
    spy.asked = []
    results: list[Execution] = []
    with anyio.fail_after(WAIT_SECONDS):
        async with anyio.create_task_group() as tg:
            await _recover_in(executor_world, tg, script, results, plugins=spy)

            async def adopted() -> bool:
                return (await executor_world.execution(attempt.execution.id)).epoch == 2

            await wait_for(adopted, "the recovery to adopt the job", WAIT_SECONDS)
            executor_world.jobs.go()
    [ex] = results
    assert ex.status is ExecutionStatus.COMPLETED, _explain(ex)
    asked = {gen for name, gen in spy.asked if name == executor_world.subject.executor}
    assert asked == {pinned}
    assert ex.snapshot.executor_generation == pinned
    assert executor_world.jobs.side_effects() == 1


async def test_program_killed_mid_run_is_recovered_not_rerun(executor_world: _World) -> None:
    """An out-of-process executor's program SIGKILLed while its job runs: the attempt goes to
    recovery at the next epoch (a ``recovered`` segment), the restarted program adopts the job
    there; nothing runs twice."""
    plugins = executor_world.subject.load_plugins()
    supervisor = {s.name: s for s in plugins.programs()}.get(executor_world.subject.executor)
    if supervisor is None:
        pytest.skip("an in-process executor has no program to kill")
    sched = executor_world.scheduler(executor_world.jobs.until_go(), plugins=plugins)
    work = await submit(sched, BINDING)
    results: list[Execution] = []

    async def run() -> None:
        lost = await sched.run_attempt(await sched.claim(work.id))
        assert lost.status.live, _explain(lost)  # handed to recovery, not failed
        (claim,) = await sched.recover_expired()  # its lease was released: due at once
        results.append(await sched.run_recovery(claim))

    with anyio.fail_after(WAIT_SECONDS):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await wait_for(executor_world.jobs.ready, "the job to start", WAIT_SECONDS)
            first = supervisor.state()["pid"]
            assert first is not None, "the program that runs the job is not running"
            os.kill(first, signal.SIGKILL)

            def restarted() -> bool:
                state = supervisor.state()
                return bool(state["restarts"] >= 1 and state["pid"] not in (None, first))

            await wait_for(restarted, "the executor program to be restarted", WAIT_SECONDS)
            # Adopted by the restarted program, not started again.
            assert executor_world.jobs.side_effects() == 1
            executor_world.jobs.go()
    [ex] = results
    executor_world.track(ex)
    assert ex.status is ExecutionStatus.COMPLETED, _explain(ex)
    assert ex.attempt == 1
    # The recovery has an epoch of its own, and the trail says it was recovered, not relaunched.
    assert [(s.epoch, s.recovered, s.relaunched) for s in ex.segments] == [
        (1, False, False),
        (2, True, False),
    ], _explain(ex)
    assert (await executor_world.store.get_work(work.id)).failure_count == 0
    assert executor_world.jobs.side_effects() == 1
    assert executor_world.live(ex.id) == []


class _LyingExecutor(Executor):
    """The subject's executor, except that ``recover`` answers "nothing started" whatever ran."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner

    async def run(self, ctx: ExecutionContext) -> Handle:
        return await self.inner.run(ctx)

    async def resume(self, ctx: ExecutionContext, wake: InputEvent) -> Handle:
        return await self.inner.resume(ctx, wake)

    async def recover(self, ctx: ExecutionContext) -> Handle:
        raise NotStartedError("a lying executor: nothing started, whatever ran")

    async def stop(self, target: StopTarget) -> StopEvidence:
        return await self.inner.stop(target)

    async def interrupt(self, target: StopTarget) -> StopEvidence:
        return await self.inner.interrupt(target)

    async def inject(self, target: StopTarget, inputs: Sequence[InputEvent]) -> None:
        await self.inner.inject(target, inputs)


class _LyingPlugins(Plugins):
    def executor(self, name: str, generation: int) -> Executor:
        return _LyingExecutor(super().executor(name, generation))


async def test_recover_that_contradicts_the_store_is_held(executor_world: _World) -> None:
    """A ``recover`` that answers ``not_started`` although the launch's recovery metadata was
    acknowledged contradicts the store: the core holds the attempt, never runs it again."""
    script = executor_world.jobs.until_go()
    attempt = await _launch(executor_world, script)
    assert attempt.execution.recovery is not None, "the launch acknowledged no metadata"
    await wait_for(executor_world.jobs.ready, "the job to start", WAIT_SECONDS)
    liar = executor_world.subject.load_plugins(_LyingPlugins)
    results: list[Execution] = []
    with anyio.fail_after(WAIT_SECONDS):
        async with anyio.create_task_group() as tg:
            await _recover_in(executor_world, tg, script, results, plugins=liar)
    [ex] = results
    assert ex.status is ExecutionStatus.RECOVERING, _explain(ex)
    assert ex.recovery_hold is not None
    assert ex.recovery_hold.code == "recovery_contradicted"
    assert not any(s.relaunched for s in ex.segments)
    work = await executor_world.store.get_work(ex.work_id)
    assert (work.failure_count, work.retry_timer_id) == (0, None)
    # Held, not stopped and not run again: the one job still runs until the teardown stops it.
    assert executor_world.jobs.side_effects() == 1
    assert executor_world.live(ex.id), "the held attempt's job was stopped"
    executor_world.jobs.go()


# --- crash injection at every launch point, in real host processes ------------------------------


@dataclass(frozen=True)
class CrashOutcome:
    """What a killed host and the host that recovered after it left in the store."""

    work: Work
    executions: list[Execution]
    side_effects_at_kill: int
    side_effects: int


def _run_host(args: HostArgs, path: Path) -> subprocess.CompletedProcess[str]:
    path.write_bytes(msgspec.json.encode(args))
    return subprocess.run(
        [sys.executable, "-m", "conduit_core.testing._host", str(path)],
        capture_output=True, text=True, timeout=WAIT_SECONDS * 2, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_EXECUTION")},
    )  # fmt: skip


async def crash_and_recover(
    subject: ExecutorSubject,
    point: CrashPoint | str,
    root: Path,
    script: str | None = None,
    *,
    after_kill: Callable[[str], object] | None = None,
) -> CrashOutcome:
    """SIGKILL a real host at ``point`` of a launch, then let a fresh host recover the attempt.

    ``after_kill`` is called with the Work id between the two hosts, to look at what the dead
    host left behind.
    """
    jobs = Jobs(root / "job")
    jobs.workdir.mkdir(exist_ok=True)
    launch = HostArgs(
        mode="launch", store=str(root / "conduit.db"), state_dir=str(root / "state"),
        work_id=f"w-{uuid.uuid4().hex[:8]}", executor=subject.executor,
        config=dict(subject.job_config(script or jobs.record(), jobs.workdir)),
        crash=CrashPoint(point), lease_ms=LEASE_MS, program=_program(subject),
    )  # fmt: skip
    killed = await anyio.to_thread.run_sync(_run_host, launch, root / "launch.json")
    if killed.returncode != -signal.SIGKILL:
        raise AssertionError(
            f"the host was not killed at {point}: it exited with {killed.returncode} (does the "
            f"executor call ctx.record_launch_intent and ctx.persist_recovery?)\n{killed.stderr}"
        )
    at_kill = jobs.side_effects()
    if after_kill is not None:
        after_kill(launch.work_id)
    recover = msgspec.structs.replace(
        launch, mode="recover", crash=None, clock_offset_ms=LEASE_MS + 1_000
    )
    recovered = await anyio.to_thread.run_sync(_run_host, recover, root / "recover.json")
    assert recovered.returncode == 0, f"the recovering host failed:\n{recovered.stderr}"
    store = await open_store(root / "conduit.db")
    async with store:
        work = await store.get_work(launch.work_id)
        executions = await store.list_executions(launch.work_id)
    return CrashOutcome(work, executions, at_kill, jobs.side_effects())


@pytest.mark.parametrize("point", LAUNCH_POINTS)
async def test_crash_at_each_launch_point_runs_the_job_once(
    point: CrashPoint, executor_world: _World
) -> None:
    killed: list[str] = []
    try:
        out = await crash_and_recover(
            executor_world.subject, point, executor_world.root, after_kill=killed.append
        )
        _check_crash_outcome(point, out, executor_world.subject)
    finally:
        # Whatever the outcome, the teardown stops what the hosts started.
        for work_id in killed:
            for ex in await executor_world.store.list_executions(work_id):
                executor_world.track(ex)


def _check_crash_outcome(point: CrashPoint, out: CrashOutcome, subject: ExecutorSubject) -> None:
    explained = "; ".join(_explain(ex) for ex in out.executions)
    if point in (CrashPoint.BEFORE_INTENT, CrashPoint.AFTER_INTENT):
        # The intent is written before anything starts: at these points nothing has.
        assert out.side_effects_at_kill == 0, "the job started before its launch intent"
    assert out.side_effects_at_kill <= 1
    # Exactly once, in one attempt: a crash costs no retry and no failure.
    assert out.work.status is WorkStatus.COMPLETED, explained
    assert [ex.attempt for ex in out.executions] == [1], explained
    assert out.work.failure_count == 0, explained
    assert out.side_effects == 1
    [ex] = out.executions
    relaunched = any(s.relaunched for s in ex.segments)
    if point in (CrashPoint.BEFORE_INTENT, CrashPoint.AFTER_INTENT):
        assert relaunched, "nothing had started, so recovery should have relaunched"
    else:
        assert not relaunched, "the job had started, so recovery should have adopted it"
    assert subject.live_resources(ex.id) == []
