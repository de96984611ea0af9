"""``conduit doctor`` without a daemon: each check says ok / warn / fail with the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

from conduit_core.config import load_config
from conduit_core.model import Event, Hold, HoldKind, Work
from conduit_core.plugins import Plugins
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
from conduit_core.storage import ClaimRequest, open_store

CONFIG = """
[settings]
store = "{store}"
data_dir = "{data}"

[bindings.echo]
executor = "echo"

[bindings.boxed]
executor = "container"
config = {{ image = "conduit-test-busybox:latest", command = ["true"] }}
"""


def doctor(config: Path, **env: str) -> tuple[int, dict[str, dict[str, str]]]:
    done = subprocess.run(
        [sys.executable, "-m", "conduit_core.cli", "doctor", "--json", "--config", str(config)],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    checks = json.loads(done.stdout)
    by_name: dict[str, dict[str, str]] = {}
    for check in checks:
        by_name.setdefault(check["name"], check)
        if check["status"] != "ok":
            by_name[check["name"]] = check
    return done.returncode, by_name


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "conduit.toml"
    path.write_text(CONFIG.format(store=tmp_path / "conduit.db", data=tmp_path / "data"))
    return path


def test_doctor_fails_on_an_unreachable_engine_and_names_the_fix(config: Path) -> None:
    code, checks = doctor(config, DOCKER_HOST="unix:///nonexistent/docker.sock")
    assert code == 1
    assert checks["docker"]["status"] == "fail"
    assert checks["docker"]["fix"]
    assert checks["store"]["status"] == "ok"


def test_doctor_warns_about_held_work_and_fails_on_a_missing_pinned_generation(
    config: Path,
) -> None:
    async def prepare() -> None:
        cfg = load_config(config)
        async with await open_store(cfg.settings.store) as store:
            sched = Scheduler(
                store, SystemClock(), Plugins.load(disabled=()),
                SchedulerOptions.from_config(cfg, config_generation=1, owner="t"),
            )  # fmt: skip
            now = SystemClock().now_ms()
            for wid in ("held", "pinned"):
                work = Work(id=wid, scope="root", binding="echo", created_at_ms=now,
                            updated_at_ms=now)  # fmt: skip
                first = Event(id=f"{wid}/in", delivery_id=f"{wid}/in", type="input",
                              work_id=wid, pending=True, accepted_at_ms=now)  # fmt: skip
                await store.create_work(work, first_input=first)
            await store.put_hold(
                Hold(work_id="held", kind=HoldKind.BUDGET, holder="turns", reason="over",
                     created_at_ms=now)
            )  # fmt: skip
            # An attempt pinned to a generation no installed package declares any more.
            snap = msgspec.structs.replace(
                sched.snapshot_for(await store.get_work("pinned")), executor_generation=9
            )
            await store.claim_attempt(
                ClaimRequest(work_id="pinned", snapshot=snap), owner="t", now_ms=now,
                lease_ms=60_000,
            )  # fmt: skip

    anyio.run(prepare)
    code, checks = doctor(config, DOCKER_HOST="unix:///nonexistent/docker.sock")
    assert code == 1
    assert checks["holds"]["status"] == "warn"
    assert "budget 'turns'" in checks["holds"]["message"]
    assert checks["holds"]["fix"]
    assert checks["pinned generations"]["status"] == "fail"
    assert "'echo' generation 9 is not installed" in checks["pinned generations"]["message"]
