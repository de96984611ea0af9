"""The CLI in direct mode (no daemon: it writes the store itself) validates like the HTTP API.

Issue 17 items 3, 5, 6 and 10: ids like ``../../etc/x`` or 5,000 characters were stored, a deep
or non-UTF-8 ``--input`` printed a traceback, ``--grace-seconds nan`` was stored and then broke
``routines list``. Real ``python -m conduit_core.cli`` processes on a real SQLite file.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = """\
[settings]
store = "{store}"
data_dir = "{data}"

[bindings.echo]
executor = "echo"
"""


@pytest.fixture
def cli(tmp_path: Path):  # type: ignore[no-untyped-def]
    config = tmp_path / "conduit.toml"
    config.write_text(CONFIG.format(store=tmp_path / "c.db", data=tmp_path / "data"))

    def run(*args: str | bytes) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "conduit_core.cli", *args, "--config", str(config)],
            capture_output=True,
            env=dict(os.environ, CONDUIT_CONFIG=str(config)),
            timeout=120,
            check=False,
        )
        return subprocess.CompletedProcess(
            proc.args, proc.returncode, proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )  # fmt: skip

    run.db = tmp_path / "c.db"  # type: ignore[attr-defined]
    return run


def _work_ids(db: Path) -> list[str]:
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        if "conduit_work" not in tables:
            return []
        return [r[0] for r in conn.execute("SELECT id FROM conduit_work")]


@pytest.mark.parametrize(
    "bad", ["../../etc/x", "x" * 5000, "a b", "a/b", "a\nb", "k:0\n", ".hidden"]
)
def test_direct_submit_refuses_bad_work_ids_and_stores_nothing(cli, bad: str) -> None:  # type: ignore[no-untyped-def]
    proc = cli("work", "submit", "echo", "--id", bad)
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.startswith("error [invalid_id]: id: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert _work_ids(cli.db) == []


def test_direct_submit_accepts_a_valid_id(cli) -> None:  # type: ignore[no-untyped-def]
    # The positive control for the refusals above.
    proc = cli("work", "submit", "echo", "--id", "k:0", "--input", '{"a": [1, {"b": 2}]}')
    assert proc.returncode == 0, proc.stderr
    assert _work_ids(cli.db) == ["k:0"]


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ("[" * 3000 + "]" * 3000, "too_deep"),
        ('{"a":' * 100 + "1" + "}" * 100, "too_deep"),
        (b"\xff\xfe{", "invalid_json"),
        ("{", "invalid_json"),
    ],
    ids=["deep-array", "deep-object", "not-utf8", "malformed"],
)
def test_bad_input_is_a_coded_error_without_a_traceback(
    cli, payload: str | bytes, code: str
) -> None:  # type: ignore[no-untyped-def]
    proc = cli("work", "submit", "echo", "--id", "w1", "--input", payload)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error [{code}]: "), proc.stderr[:300]
    assert "Traceback" not in proc.stderr
    assert _work_ids(cli.db) == []


@pytest.mark.parametrize("grace", ["nan", "inf", "-1", "1e306"])
def test_routines_add_refuses_non_finite_grace_and_stores_nothing(cli, grace: str) -> None:  # type: ignore[no-untyped-def]
    proc = cli(
        "routines",
        "add",
        "r1",
        "--cron",
        "*/5 * * * *",
        "--binding",
        "echo",
        "--grace-seconds",
        grace,
    )
    assert proc.returncode == 1, proc.stdout
    assert "grace_seconds" in proc.stderr
    assert "Traceback" not in proc.stderr
    listed = cli("routines", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "r1" not in listed.stdout


def test_a_stored_non_finite_grace_does_not_break_routines_list(cli) -> None:  # type: ignore[no-untyped-def]
    assert (
        cli("routines", "add", "r1", "--cron", "*/5 * * * *", "--binding", "echo").returncode == 0
    )
    # What an older release stored for --grace-seconds nan: JSON null.
    with sqlite3.connect(cli.db) as conn:
        (data,) = conn.execute("SELECT data FROM conduit_routine WHERE id = 'r1'").fetchone()
        record = json.loads(data)
        record["grace_seconds"] = None
        conn.execute("UPDATE conduit_routine SET data = ? WHERE id = 'r1'", (json.dumps(record),))
    listed = cli("routines", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "r1" in listed.stdout
