"""An attempt that completes frees its slot for a claim, not for a whole host-loop pass.

A pass reads timers, expired leases, stops and controls and settles budgets: five reads and a
write the completed attempt leaves nothing for. Here the rescan is 30 s, so every pass that runs
was woken: a backlog of 300 echo jobs on 4 slots drains with the passes the submits wake, where
every attempt's end used to wake one. An attempt that fails still wakes a pass: its retry timer
is fired by one, long before the rescan.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from conduit_core import embed
from conduit_core.client import SubmitItem

CONFIG = """\
[settings]
store = "{root}/conduit.db"
data_dir = "{root}/data"
concurrency = 4
job_concurrency = 4

[bindings.quick]
executor = "echo"

[bindings.flaky]
executor = "shell"
retry_delays_seconds = [0.2]
config = {{ command = 'test -e {root}/ran || {{ touch {root}/ran; exit 3; }}' }}
"""

JOBS = 300


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "conduit.toml"
    path.write_text(CONFIG.format(root=tmp_path))
    return path


@pytest.mark.anyio
async def test_completed_attempts_refill_their_slots_without_passes(tmp_path: Path) -> None:
    async with embed.run(_config(tmp_path), rescan_s=30) as scheduler:
        assert scheduler.host is not None
        passes_before = scheduler.host.passes
        batch = await scheduler.submit_many(
            [SubmitItem(binding="quick", id=f"q-{i}") for i in range(JOBS)]
        )
        assert batch.created == JOBS
        with anyio.fail_after(60):
            for i in range(JOBS):
                outcome = await scheduler.wait(f"q-{i}", timeout=60)
                assert outcome.status == "completed"
        passes = scheduler.host.passes - passes_before
    # The submit's wake, and a pass a slot-refilling claim's wake may add: never one per job.
    assert passes <= JOBS // 20, f"{passes} passes for {JOBS} completed attempts"


@pytest.mark.anyio
async def test_a_failed_attempt_still_wakes_a_pass_for_its_retry(tmp_path: Path) -> None:
    async with embed.run(_config(tmp_path), rescan_s=30) as scheduler:
        started = time.monotonic()
        await scheduler.submit("flaky", id="f-1")
        outcome = await scheduler.wait("f-1", timeout=20)
        assert outcome.status == "completed"
        assert outcome.attempts == 2
        # The retry timer (0.2 s) was fired by a pass the failure woke, not by the 30 s rescan.
        assert time.monotonic() - started < 15
