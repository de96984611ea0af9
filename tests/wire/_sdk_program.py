"""A minimal executor program on the SDK, for the bad-message tests of the program's side."""

from __future__ import annotations

import conduit_core.extension as ext
from conduit_core.extension import wire


class Done(ext.Handle):
    async def wait(self) -> ext.Result:
        return ext.Result(outcome=ext.OutcomeKind.COMPLETED, data={"n": "not an int"})


class Instant(ext.Executor):
    async def run(self, ctx: ext.ExecutionContext) -> ext.Handle:
        await ctx.record_launch_intent({"k": 1})
        return Done()

    async def recover(self, ctx: ext.ExecutionContext) -> ext.Handle:
        raise ext.NotStartedError()

    async def stop(self, target: ext.StopTarget) -> ext.StopEvidence:
        return ext.StopEvidence(verified=True)


if __name__ == "__main__":
    import msgspec

    class Counted(msgspec.Struct):
        n: int

    wire.serve(wire.manifest_for(name="instant", generation=1), {1: Instant()}, result_data=Counted)
