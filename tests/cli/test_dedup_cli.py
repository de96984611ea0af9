"""``conduit work submit`` with dedup and debounce keys in direct mode (no daemon: the CLI
writes the store itself), real processes on a real SQLite file (docs/dedup.md)."""

from __future__ import annotations

import json
import sqlite3

from tests.cli import test_direct_validation as direct

cli = direct.cli
_work_ids = direct._work_ids


def test_a_duplicate_submit_prints_the_existing_work_and_exits_0(cli) -> None:  # type: ignore[no-untyped-def]
    first = cli("work", "submit", "echo", "--dedup-key", "o-1", "--json")
    assert first.returncode == 0, first.stderr
    made = json.loads(first.stdout)
    assert made["deduplicated"] is False
    again = cli("work", "submit", "echo", "--dedup-key", "o-1", "--dedup", "active")
    assert again.returncode == 0, again.stderr
    assert f"deduplicated: {made['work']['id']}" in again.stdout
    assert _work_ids(cli.db) == [made["work"]["id"]]


def test_a_debounce_holds_one_work_and_keeps_each_input(cli) -> None:  # type: ignore[no-untyped-def]
    args = ("--debounce-key", "b", "--quiet", "1h", "--max-wait", "2h", "--json")
    one = json.loads(cli("work", "submit", "echo", "--input", "1", *args).stdout)
    two = json.loads(cli("work", "submit", "echo", "--input", "2", *args).stdout)
    assert (one["deduplicated"], two["deduplicated"]) == (False, True)
    assert two["work"]["id"] == one["work"]["id"]
    assert two["work"]["pending_inputs"] == 2
    assert two["work"]["debounce_until_ms"] is not None
    with sqlite3.connect(cli.db) as conn:
        (kind,) = conn.execute("SELECT data FROM conduit_timer").fetchone()
    assert json.loads(kind)["kind"] == "debounce"


def test_bad_key_options_are_refused_and_store_nothing(cli) -> None:  # type: ignore[no-untyped-def]
    cases = [
        (("--quiet", "5s"), "--quiet and --max-wait go with --debounce-key"),
        (("--debounce-key", "b"), "--debounce-key needs --quiet"),
        (("--dedup-key", "k", "--dedup-window", "10 minutes"), "invalid_duration"),
        (("--dedup-key", "k", "--debounce-key", "b", "--quiet", "1s"), "dedup_and_debounce"),
    ]
    for args, message in cases:
        done = cli("work", "submit", "echo", *args)
        assert done.returncode != 0
        assert message in done.stderr, (args, done.stderr)
    assert _work_ids(cli.db) == []
