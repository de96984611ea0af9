"""``conduit routines …`` round trips and ``[[routines]]`` reconciliation, on both backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from click.testing import CliRunner

from conduit_core.cli import cli
from conduit_core.config import parse_config
from conduit_core.model import RoutineStatus
from conduit_core.routines import reconcile_routines
from conduit_core.runtime import ManualClock
from conduit_core.storage import Store, open_store
from tests.routines.conftest import T0

pytestmark = pytest.mark.anyio

CONFIG = """
[settings]
store = "{store}"

[scopes.root]
[scopes.team-a]
parent = "root"

[bindings.echo]
executor = "scripted"

[bindings.team-job]
executor = "scripted"
scope = "team-a"
{routines}
"""

ROUTINES = """
[[routines]]
id = "nightly"
cron = "0 2 * * *"
binding = "echo"
timezone = "Europe/Berlin"
input = { report = "daily" }

[[routines]]
id = "quarterly"
cron = "*/15 * * * *"
binding = "team-job"
misfire = "skip"
"""


def write_config(tmp_path: Path, store_url: str, routines: str = "") -> Path:
    path = tmp_path / "conduit.toml"
    path.write_text(CONFIG.format(store=store_url, routines=routines))
    return path


def invoke(config: Path, *args: str, ok: bool = True) -> Any:
    result = CliRunner().invoke(cli, ["routines", *args, "--config", str(config)])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def as_json(config: Path, *args: str) -> Any:
    return msgspec.json.decode(invoke(config, *args, "--json").output)


def test_cli_round_trip_add_list_pause_resume_remove(tmp_path: Path, store_url: str) -> None:
    config = write_config(tmp_path, store_url)
    added = as_json(config, "add", "hourly", "--cron", "0 * * * *", "--binding", "echo",
                    "--input", '{"n": 1}', "--timezone", "America/New_York")  # fmt: skip
    assert (added["id"], added["status"], added["scope"]) == ("hourly", "idle", "root")
    assert added["target"]["input"] == {"n": 1}
    assert added["next_run_at_ms"] is not None
    listed = as_json(config, "list")
    assert [r["id"] for r in listed] == ["hourly"]
    assert as_json(config, "pause", "hourly")["status"] == "paused"
    assert as_json(config, "pause", "hourly")["status"] == "paused"  # a no-op, not an error
    resumed = as_json(config, "resume", "hourly")
    assert (resumed["status"], resumed["next_run_at_ms"] is not None) == ("idle", True)
    ran = as_json(config, "run", "hourly")
    assert ran["next_run_at_ms"] <= resumed["next_run_at_ms"]
    assert as_json(config, "history", "hourly") == []
    assert "hourly" in invoke(config, "list").output
    assert as_json(config, "remove", "hourly") == {"id": "hourly", "removed": True}
    assert as_json(config, "list") == []


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--cron", "* * *", "--binding", "echo"], "invalid_cron_spec"),
        (["--cron", "once@2020-01-01T00:00:00Z", "--binding", "echo"], "invalid_cron_spec"),
        (["--cron", "once@2099-01-01T00:00:00", "--binding", "echo"], "invalid_cron_spec"),
        (["--cron", "0 * * * *", "--binding", "echo", "--timezone", "Nowhere/X"],
         "invalid_timezone"),
        (["--cron", "0 * * * *", "--binding", "nope"], "unknown_binding"),
        (["--cron", "0 * * * *", "--binding", "echo", "--scope", "team-z"], "unknown_scope"),
    ],
)  # fmt: skip
def test_cli_refuses_bad_input_and_stores_nothing(
    tmp_path: Path, store_url: str, args: list[str], code: str
) -> None:
    config = write_config(tmp_path, store_url)
    result = invoke(config, "add", "bad", *args, ok=False)
    assert result.exit_code == 1
    assert f"[{code}]" in result.output
    assert as_json(config, "list") == []


def test_cli_refuses_once_beyond_year_9998_and_lists_a_stored_one(
    tmp_path: Path, store_url: str
) -> None:
    config = write_config(tmp_path, store_url)
    bad = "once@9999-12-31T23:59:59-23:59"  # year 10000 in UTC
    result = invoke(config, "add", "far", "--cron", bad, "--binding", "echo", ok=False)
    assert "[invalid_cron_spec]" in result.output
    assert "out of range" in result.output
    assert as_json(config, "list") == []
    # A row stored before the bound existed still lists (text and JSON), never a traceback.
    as_json(config, "add", "far", "--cron", "once@9998-01-01T00:00:00Z", "--binding", "echo")

    async def store_the_old_value() -> None:
        async with await open_store(store_url) as store:
            await store.apply_routine(
                "far",
                lambda r: msgspec.structs.replace(
                    r, cron_spec=bad, next_run_at_ms=253_402_300_799_000 + 86_400_000
                ),
            )

    anyio.run(store_the_old_value)
    listed = invoke(config, "list")
    assert "far" in listed.output
    assert "out-of-range" in listed.output
    assert as_json(config, "list")[0]["cron_spec"] == bad


def test_cli_unknown_routine_is_not_found(tmp_path: Path, store_url: str) -> None:
    config = write_config(tmp_path, store_url)
    for command in ("pause", "resume", "run", "remove", "history"):
        result = invoke(config, command, "ghost", ok=False)
        assert "[not_found]" in result.output, command


async def test_config_reconcile_is_idempotent_and_leaves_runtime_state(
    tmp_path: Path, store: Store, store_url: str
) -> None:
    clock = ManualClock(T0)
    config = parse_config(CONFIG.format(store=store_url, routines=ROUTINES))
    first = await reconcile_routines(store, config, clock)
    assert sorted(first.created) == ["nightly", "quarterly"]
    rows = {r.id: r for r in await store.list_routines()}
    assert rows["nightly"].from_config
    assert rows["nightly"].target.input == {"report": "daily"}
    assert rows["quarterly"].scope == "team-a"
    # Reconciling again (a reload with the same config) changes nothing.
    again = await reconcile_routines(store, config, clock)
    assert (again.created, again.updated, again.removed) == ([], [], [])
    assert sorted(again.unchanged) == ["nightly", "quarterly"]
    assert {r.id: r for r in await store.list_routines()} == rows
    # Runtime state survives a changed declaration; a dropped declaration removes its row; a
    # CLI-added row is never touched.
    await store.apply_routine(
        "nightly", lambda r: msgspec.structs.replace(r, status=RoutineStatus.PAUSED)
    )
    cli_config = write_config(tmp_path, store_url)
    await anyio.to_thread.run_sync(
        lambda: invoke(cli_config, "add", "manual-one", "--cron", "0 * * * *", "--binding", "echo")
    )
    changed = parse_config(
        CONFIG.format(
            store=store_url,
            routines=ROUTINES.replace('"0 2 * * *"', '"0 3 * * *"').split('[[routines]]\nid = "q')[
                0
            ],
        )
    )
    report = await reconcile_routines(store, changed, clock)
    assert (report.updated, report.removed) == (["nightly"], ["quarterly"])
    nightly = await store.get_routine("nightly")
    assert (nightly.cron_spec, nightly.status) == ("0 3 * * *", RoutineStatus.PAUSED)
    assert sorted(r.id for r in await store.list_routines()) == ["manual-one", "nightly"]
    clash = parse_config(
        CONFIG.format(store=store_url, routines=ROUTINES.replace("nightly", "manual-one"))
    )
    report = await reconcile_routines(store, clash, clock)
    assert "manual-one" in report.skipped
    assert not (await store.get_routine("manual-one")).from_config
