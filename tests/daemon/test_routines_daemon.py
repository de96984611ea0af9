"""Routines in the daemon: declared in conduit.toml, fired by the ticker, listed over HTTP."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

from .conftest import Daemon, wait_for

ROUTINE = """
[[routines]]
id = "every-second"
cron = "* * * * * *"
binding = "ok"
"""


def test_a_config_routine_fires_through_the_daemon_and_is_listed(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(extra=ROUTINE).start()

    def fired_twice() -> list[str] | None:
        lines = daemon.side.read_text().split("\n") if daemon.side.exists() else []
        runs = [line for line in lines if line.endswith(" run")]
        return runs if len(runs) >= 2 else None

    runs = wait_for("two fires of the every-second routine", fired_twice)
    # Each fire made its own Work (keyed by routine and scheduled instant), run once.
    work_ids = [line.split()[0] for line in runs]
    assert len(set(work_ids)) == len(work_ids)
    status, doc = daemon.raw("GET", "/v1/schedules")
    assert status == 200
    conduit = next(r for r in doc["records"] if r["id"] == "conduit:every-second")
    assert conduit["domain"] == "conduit"
    assert conduit["manageability"] == "managed"
    health = {s["source"]: s["status"] for s in doc["sources"]}
    assert health["conduit"] == "ok"
    # A plugin's observe-only source (conduit_schedule_sources) is listed beside the Routines.
    assert health["test-remote"] == "ok"
    assert any(r["id"] == "test-remote:nightly" for r in doc["records"])
    # Reload keeps the ledger row without duplicating it.
    daemon.signal(signal.SIGHUP)
    proc = daemon.cli("routines", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [r["id"] for r in json.loads(proc.stdout) if r["id"] == "every-second"] == [
        "every-second"
    ]
