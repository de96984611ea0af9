"""The out-of-process twin of the test plugin's in-process ``echo``: completes at once.

Started by bench/bench_wire.py as ``[executors.wire-echo] command = [python, this file]``.
"""

from __future__ import annotations

import conduit_core.extension as ext
from conduit_core.extension import wire


class _Done(ext.Handle):
    def __init__(self, result: ext.Result) -> None:
        self._result = result

    async def wait(self) -> ext.Result:
        return self._result


class WireEcho(ext.Executor):
    def _result(self, ctx: ext.ExecutionContext, how: str) -> ext.Result:
        data = {"inputs": [event.payload for event in ctx.inputs]}
        return ext.Result(outcome=ext.OutcomeKind.COMPLETED, summary=f"wire-echo {how}", data=data)

    async def run(self, ctx: ext.ExecutionContext) -> ext.Handle:
        await ctx.persist_recovery({"generation": 1})  # the same fenced write as echo
        return _Done(self._result(ctx, "ran"))

    async def recover(self, ctx: ext.ExecutionContext) -> ext.Handle:
        return _Done(self._result(ctx, "recovered"))

    async def stop(self, target: ext.StopTarget) -> ext.StopEvidence:
        return ext.StopEvidence(verified=True, detail="nothing runs outside the call")


if __name__ == "__main__":
    wire.serve(wire.manifest_for(name="wire-echo", generation=1), {1: WireEcho()})
