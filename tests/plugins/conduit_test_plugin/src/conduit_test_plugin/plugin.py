"""An in-process executor with two generations, a start gate, and the other hooks.

Everything here is deterministic and quick so the core's tests can drive real plugin loading.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence

import anyio

from conduit_core.extension import (
    ExecutionContext,
    Executor,
    ExecutorRegistration,
    GateRegistration,
    GateRequest,
    Handle,
    OutcomeKind,
    Result,
    RetryHint,
    ScheduleRecord,
    SourceRead,
    StartGate,
    StartHold,
    StopEvidence,
    StopTarget,
    hookimpl,
)
from conduit_test_plugin.scripted import ScriptedExecutor


class _Done(Handle):
    def __init__(self, result: Result, delay_s: float = 0.0) -> None:
        self._result = result
        self._delay_s = delay_s

    async def wait(self) -> Result:
        if self._delay_s > 0:
            await anyio.sleep(self._delay_s)
        return self._result


def _log_start(ctx: ExecutionContext) -> None:
    """With ``start_log`` in the binding config (bench/bench_daemon.py), append ``<work id> <the
    first input's "t"> <now>`` (seconds since the epoch) as the job starts: the bench's
    insert → start latency, and its count of runs per Work."""
    path = ctx.config.get("start_log")
    if not path:
        return
    payload = ctx.inputs[0].payload if ctx.inputs else None
    t0 = payload.get("t") if isinstance(payload, dict) else None
    line = f"{ctx.work_id} {t0} {time.time():.6f}\n".encode()
    fd = os.open(str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)  # one short append: a whole line, never interleaved
    finally:
        os.close(fd)


class EchoExecutor(Executor):
    """Completes at once (after ``sleep_ms`` of the binding config, if set), echoing its inputs."""

    def __init__(self, generation: int) -> None:
        self.generation = generation

    def _result(self, ctx: ExecutionContext, how: str) -> Result:
        return Result(
            outcome=OutcomeKind.COMPLETED,
            summary=f"echo generation {self.generation} {how}",
            data={"inputs": [event.payload for event in ctx.inputs]},
        )

    async def run(self, ctx: ExecutionContext) -> Handle:
        # ``writes_first``: the fenced write comes before the job does anything (its start line).
        await ctx.persist_recovery({"generation": self.generation})
        _log_start(ctx)
        delay_s = float(ctx.config.get("sleep_ms", 0)) / 1000
        return _Done(self._result(ctx, "ran"), delay_s)

    async def recover(self, ctx: ExecutionContext) -> Handle:
        return _Done(self._result(ctx, "recovered"))

    async def stop(self, target: StopTarget) -> StopEvidence:
        return StopEvidence(verified=True, detail="nothing runs outside the call")


#: (gate, work_id) for every question a start gate of this plugin was asked, in order.
GATE_CALLS: list[tuple[str, str]] = []
#: Called with every request ``test-allow`` is asked about (a test's stand-in for a slow gate).
ON_ASK: list[Callable[[GateRequest], None]] = []
#: True: both gates may hold every first start, so every one is asked about (the tests drive
#: the asking path through plain Work). False: only Work whose first input names one of their
#: keys, as a user's gates (the human gate's rules) select some Work, not all (the benches; a
#: daemon started with ``CONDUIT_TEST_PLUGIN_GATES=selected``, as bench/bench_daemon.py does).
ASK_EVERY_START = os.environ.get("CONDUIT_TEST_PLUGIN_GATES", "every") != "selected"

#: The first-input keys the two gates act on.
_GATE_KEYS = ("hold", "probe_hold", "gate_error")


class _TestGate(StartGate):
    def may_hold(self, request: GateRequest) -> bool:
        if ASK_EVERY_START:
            return True
        payload = request.first_input.payload if request.first_input else None
        return isinstance(payload, dict) and any(key in payload for key in _GATE_KEYS)


class AllowGate(_TestGate):
    async def check(self, request: GateRequest) -> StartHold | None:
        GATE_CALLS.append(("test-allow", request.work_id))
        for hook in ON_ASK:
            hook(request)
        payload = request.first_input.payload if request.first_input else None
        if isinstance(payload, dict) and payload.get("hold"):
            return StartHold(reason=str(payload["hold"]))
        return None


class ProbeGate(_TestGate):
    """Asked after ``test-allow``: holds on ``{"probe_hold": reason}``, raises on
    ``{"gate_error": true}``, lets everything else start."""

    async def check(self, request: GateRequest) -> StartHold | None:
        GATE_CALLS.append(("test-probe", request.work_id))
        payload = request.first_input.payload if request.first_input else None
        if isinstance(payload, dict) and payload.get("gate_error"):
            raise RuntimeError("the probe gate cannot decide")
        if isinstance(payload, dict) and payload.get("probe_hold"):
            return StartHold(reason=str(payload["probe_hold"]))
        return None


@hookimpl
def conduit_executors() -> Sequence[ExecutorRegistration]:
    return [
        ExecutorRegistration(name="echo", generation=2, executor=EchoExecutor(2)),
        ExecutorRegistration(name="echo", generation=1, executor=EchoExecutor(1)),
        ExecutorRegistration(name="scripted", generation=1, executor=ScriptedExecutor("scripted")),
        ExecutorRegistration(
            name="scripted-job", generation=1, executor=ScriptedExecutor("scripted-job")
        ),
        ExecutorRegistration(
            name="scripted-first", generation=1, executor=ScriptedExecutor("scripted-first")
        ),
    ]


@hookimpl
def conduit_start_gates() -> Sequence[GateRegistration]:
    return [
        GateRegistration(name="test-probe", gate=ProbeGate()),
        GateRegistration(name="test-allow", gate=AllowGate()),
    ]


@hookimpl
def conduit_run_environment(scope_chain: Sequence[str]) -> Mapping[str, str] | None:
    # Only scopes named for it get a value, so other tests' attempts see nothing from here.
    if "test-env" in scope_chain:
        return {"CONDUIT_TEST_ENV": "from-test-plugin"}
    return None


@hookimpl
def conduit_retry_hint(executor: str, error: BaseException | None) -> RetryHint | None:
    if executor == "echo" and error is not None and "rate limited" in str(error):
        return RetryHint(unknown_reset=True, reason="rate limited")
    # The scripted executor's observation failures carry the code the test scripts.
    if executor == "scripted" and getattr(error, "code", None) == "rate_limited":
        return RetryHint(unknown_reset=True, reason="rate limited")
    return None


class RemoteSource:
    """An observe-only schedule source of another system, for the schedule view."""

    name = "test-remote"
    domain = "external"
    manageability = "observe-only"

    async def read(self) -> SourceRead:
        # A daemon started with this variable sees the other system down (the console shows it).
        if os.environ.get("CONDUIT_TEST_REMOTE_DOWN"):
            return SourceRead(status="degraded", detail="test-remote: connection refused")
        return SourceRead(
            records=[
                ScheduleRecord(
                    id="test-remote:nightly",
                    source=self.name,
                    domain="external",
                    manageability="observe-only",
                    spec="0 3 * * *",
                    status="scheduled",
                )
            ]
        )


@hookimpl
def conduit_schedule_sources() -> Sequence[RemoteSource]:
    return [RemoteSource()]
