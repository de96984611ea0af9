"""Launch one container through the executor, record its metadata, then wait to be SIGKILLed.

Run as ``python -m tests.container.crash_launcher EXECUTION_ID STATE_DIR METADATA_FILE``: the
stand-in for a daemon process that dies while its container runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

from conduit_executors_container import ContainerExecutor

from .conftest import TEST_IMAGE
from .engine_checks import WAIT_FOR_GO
from .harness import RecordingCallbacks, make_context

#: The job the crash tests launch: it waits for the test, then says so and exits 7.
CRASH_JOB = f"{WAIT_FOR_GO}; echo adopted-output; exit 7"


async def main(execution_id: str, state_dir: Path, metadata_file: Path) -> None:
    callbacks = RecordingCallbacks(metadata_file=metadata_file)
    ctx = make_context(
        execution_id=execution_id,
        config={"image": TEST_IMAGE, "command": CRASH_JOB},
        callbacks=callbacks,
        state_dir=state_dir,
    )
    await ContainerExecutor().run(ctx)
    print("launched", flush=True)
    await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
