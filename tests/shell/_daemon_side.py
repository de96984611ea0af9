"""The daemon side of a crash drill, run in its own process and killed with SIGKILL by the test.

Usage: python -m tests.shell._daemon_side <args.json>. It launches one job through the shell
executor, persisting recovery metadata to the file the args name, then observes the job until
it is killed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio

from conduit_executors_shell import ShellExecutor
from tests.shell._harness import FileCallbacks, make_context


async def launch_and_observe(args: dict[str, object]) -> None:
    workdir = Path(str(args["workdir"]))
    callbacks = FileCallbacks(Path(str(args["metadata"])))
    ctx, _ = make_context(
        workdir,
        args["config"],  # type: ignore[arg-type]
        execution_id=str(args["execution_id"]),
        generation=int(args["generation"]),  # type: ignore[call-overload]
        callbacks=callbacks,
    )
    handle = await ShellExecutor(ctx.generation).run(ctx)
    print("launched", flush=True)
    await handle.wait()
    print("observed", flush=True)


if __name__ == "__main__":
    anyio.run(launch_and_observe, json.loads(Path(sys.argv[1]).read_text()))
