"""An out-of-process executor in Python: the whole program (entry point ``example-wire``).

It runs a shell line as a detached job that outlives this program, so a restarted program (or
daemon) finds it again through the launch intent: the job's directory and a marker every
process of the job carries in its environment (``DetachedJobs``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

import conduit_core.extension as ext
from conduit_core.extension import wire

JOBS = ext.DetachedJobs("CONDUIT_EXAMPLE_WIRE_LAUNCH")


class Config(msgspec.Struct, forbid_unknown_fields=True):
    command: str


class JobData(msgspec.Struct):  # the typed result data, checked by the SDK and by the core
    exit_status: int


def key(execution_id: str) -> str:
    return hashlib.sha256(execution_id.encode()).hexdigest()[:24]


class Job(ext.Handle):
    def __init__(self, launch: dict[str, str]) -> None:
        self.dir, self.marker = Path(launch["dir"]), launch["marker"]

    async def wait(self) -> ext.Result:
        code = await JOBS.wait(self.dir, self.marker)
        if code is None:
            raise ext.OperationError("job_vanished", "the job ended without an exit status")
        outcome = ext.OutcomeKind.COMPLETED if code == 0 else ext.OutcomeKind.FAILED
        data = msgspec.to_builtins(JobData(exit_status=code))
        return ext.Result(outcome=outcome, summary=f"exit status {code}", data=data)


class WireExample(ext.Executor):
    async def run(self, ctx: ext.ExecutionContext) -> ext.Handle:
        try:
            config = msgspec.convert(dict(ctx.config), Config)
        except msgspec.ValidationError as exc:
            raise ext.OperationError("invalid_config", str(exc), permanent=True) from exc
        marker = f"{key(ctx.execution_id)}/{ctx.epoch}"
        launch = {"dir": str(Path(ctx.state_dir or "/tmp", "wire", marker)), "marker": marker}
        env = {**ctx.env, "CONDUIT_WORK_ID": ctx.work_id}
        # The intent's fenced write and the start under one lock a recovery's look can see.
        async with JOBS.launching(Path(launch["dir"])):
            await ctx.record_launch_intent(launch)  # durable before anything starts
            await JOBS.start(Path(launch["dir"]), config.command, marker, env)
        await ctx.persist_recovery(launch)
        return Job(launch)

    async def recover(self, ctx: ext.ExecutionContext) -> ext.Handle:
        launch = ctx.recovery or ctx.launch_intent
        if launch is not None and JOBS.launch_in_progress(Path(launch["dir"])):
            # An earlier launch may still start it: cannot tell yet (held, asked again).
            raise ext.OperationError("launch_in_progress", "a launch still holds the lock")
        if launch is None or not JOBS.exists(Path(launch["dir"]), launch["marker"]):
            if ctx.recovery is None:  # only an intent: nothing carries its marker, never started
                raise ext.NotStartedError("no process carries the launch marker")
            raise ext.ResourcesGoneError("the job left no process and no exit status")
        await ctx.persist_recovery(launch)
        return Job(launch)

    async def stop(self, target: ext.StopTarget) -> ext.StopEvidence:
        return await JOBS.kill(f"{key(target.execution_id)}/")

    async def output_tail(self, target: ext.StopTarget, stream: str, most: int) -> bytes | None:
        found = target.recovery or target.launch_intent  # both streams: one file, as stdout
        return JOBS.output_tail(Path(found["dir"]), most) if found and stream == "stdout" else None


MANIFEST = wire.manifest_for(
    name="example-wire", generation=1, pool="jobs", capabilities=["stop", "interrupt", "output"],
    config_type=Config, result_data=JobData,
)  # fmt: skip


def main() -> None:
    wire.serve(MANIFEST, {1: WireExample()}, result_data=JobData)
