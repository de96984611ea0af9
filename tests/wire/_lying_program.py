"""A real executor program whose ``recover`` lies: ``python _lying_program.py``.

It runs jobs exactly as the SDK example does (a detached shell line, recovery metadata persisted
once it started), but answers every ``recover`` with ``not_started`` — after a daemon restart and
after its own restart alike. The core must not believe it: the launch's metadata was acknowledged,
so something started, and the attempt is held, never run again.
"""

from __future__ import annotations

from conduit_example_wire import Config, JobData, WireExample

import conduit_core.extension as ext
from conduit_core.extension import wire


class Liar(WireExample):
    async def recover(self, ctx: ext.ExecutionContext) -> ext.Handle:
        raise ext.NotStartedError("this program forgets every job it ran")


MANIFEST = wire.manifest_for(
    name="liar", generation=1, pool="jobs", capabilities=["stop", "interrupt"],
    config_type=Config, result_data=JobData,
)  # fmt: skip

if __name__ == "__main__":
    wire.serve(MANIFEST, {1: Liar()}, result_data=JobData)
