"""A wire executor program in a pool of its own, ``racers``, for the capacity race detectors.

Each attempt appends ``<work id> start`` to SIDE when it is launched, waits until the file
ROOT/release.<work id> exists, appends ``<work id> end`` and completes: what the daemon test's
``held`` shell jobs do, in a named pool. Started as
``[executors.held-pool] command = [python, this file, SIDE, ROOT]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

import conduit_core.extension as ext
from conduit_core.extension import wire

SIDE, ROOT = Path(sys.argv[1]), Path(sys.argv[2])


def _append(line: str) -> None:
    with SIDE.open("a") as side:
        side.write(line + "\n")


class _Held(ext.Handle):
    def __init__(self, work_id: str) -> None:
        self._work_id = work_id

    async def wait(self) -> ext.Result:
        # A file another process touches: nothing to await but its existence.
        while not (ROOT / f"release.{self._work_id}").exists():  # noqa: ASYNC110
            await anyio.sleep(0.05)
        _append(f"{self._work_id} end")
        return ext.Result(outcome=ext.OutcomeKind.COMPLETED, summary="released")


class HeldPool(ext.Executor):
    async def run(self, ctx: ext.ExecutionContext) -> ext.Handle:
        _append(f"{ctx.work_id} start")
        await ctx.persist_recovery({"held": ctx.work_id})
        return _Held(ctx.work_id)

    async def recover(self, ctx: ext.ExecutionContext) -> ext.Handle:
        return _Held(ctx.work_id)

    async def stop(self, target: ext.StopTarget) -> ext.StopEvidence:
        return ext.StopEvidence(verified=True, detail="nothing runs outside the program")


if __name__ == "__main__":
    wire.serve(wire.manifest_for(name="held-pool", generation=1, pool="racers"), {1: HeldPool()})
