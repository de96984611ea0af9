"""An attempt that completes frees its slot for a claim, not for a whole host-loop pass; a
submit is claimed for the same way (with a dedup key or without).

A pass reads timers, expired leases, stops and controls and settles budgets: five reads and a
write that neither a completed attempt nor a new Work leaves anything for. Here the rescan is
30 s, so every pass that runs was woken: a backlog of 300 echo jobs on 4 slots drains with no
more passes than a few, where every attempt's end used to wake one, and submits (one at a time
or in a batch) wake none. An attempt that fails still wakes a pass: its retry timer is fired by
one, long before the rescan; so does a debounced submit (its start is a timer).
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
    # A pass a slot-refilling claim's wake may add: never one per job.
    assert passes <= JOBS // 20, f"{passes} passes for {JOBS} completed attempts"


@pytest.mark.anyio
async def test_a_submit_is_claimed_without_a_pass(tmp_path: Path) -> None:
    async with embed.run(_config(tmp_path), rescan_s=30) as scheduler:
        host = scheduler.host
        assert host is not None
        with anyio.fail_after(10):
            # The start's own pass has begun (the next is 30 s away): a counter, polled.
            while host.passes < 1:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        passes_before = host.passes
        ids = []
        for i in range(10):
            ids.append((await scheduler.submit("quick", id=f"one-{i}")).work.id)
        batch = await scheduler.submit_many(
            [SubmitItem(binding="quick", id=f"many-{i}") for i in range(10)]
            + [SubmitItem(binding="quick", id=f"keyed-{i}", dedup_key=f"k{i}") for i in range(5)]
        )
        assert batch.created == 15
        ids += [item.id for item in batch.items if item.id is not None]
        for work_id in ids:
            outcome = await scheduler.wait(work_id, timeout=20)
            assert outcome.status == "completed"
        # Each submit was claimed for at once (the jobs started long before the rescan), and
        # not one woke a pass.
        assert host.passes == passes_before, f"{host.passes - passes_before} passes"


@pytest.mark.anyio
async def test_a_debounced_submit_still_wakes_a_pass_for_its_timer(tmp_path: Path) -> None:
    config = tmp_path / "conduit.toml"
    config.write_text(
        CONFIG.format(root=tmp_path)
        + '\n[bindings.debounced]\nexecutor = "echo"\n'
        + 'debounce = { key = "k", quiet = "300ms", max_wait = "5s" }\n'
    )
    async with embed.run(config, rescan_s=30) as scheduler:
        started = time.monotonic()
        detail = await scheduler.submit("debounced", id="d-1")
        outcome = await scheduler.wait(detail.work.id, timeout=20)
        assert outcome.status == "completed"
        # Its start was a 0.3 s timer: fired by the pass the submit woke, not the 30 s rescan.
        assert time.monotonic() - started < 15


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
