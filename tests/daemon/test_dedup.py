"""Dedup and debounce through real daemons (docs/dedup.md).

Racing submitters (threads over HTTP and ``conduit work submit`` processes) on two daemons
sharing a PostgreSQL store, and on one SQLite store: exactly one Work, everyone gets its id. A
debounced burst runs once after the quiet period; a continuous stream is bounded by the maximum
wait; a daemon killed mid-debounce keeps the pending start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import pytest

from conduit_core.client import Client, Debounce, SubmitItem
from conduit_core.http import WorkPage
from conduit_core.storage import SqlStore, open_store
from tests.daemon.conftest import Daemon, wait_for

DEBOUNCED = """
[bindings.debounced]
executor = "shell"
debounce = {{ key = "group-{{group}}", quiet = "{quiet}", max_wait = "{max_wait}" }}
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}' }}

[bindings.dedup_order]
executor = "shell"
dedup_key = "order-{{order}}"
dedup = "active"
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}' }}
"""

RACERS = 12


def _extra(tmp_side: Any, quiet: str = "1s", max_wait: str = "30s") -> str:
    return DEBOUNCED.format(side=tmp_side, quiet=quiet, max_wait=max_wait)


def _post(daemon: Daemon, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return daemon.raw("POST", "/v1/work", msgspec.json.encode(body))


def _race(daemons: list[Daemon], body: Callable[[int], dict[str, Any]]) -> list[tuple[int, Any]]:
    """``RACERS`` threads, spread over ``daemons``, post at once; each answer's status and body."""
    gate = threading.Barrier(RACERS)
    answers: list[tuple[int, Any]] = [(0, None)] * RACERS

    def run(n: int) -> None:
        gate.wait()
        answers[n] = _post(daemons[n % len(daemons)], body(n))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return answers


def _cli_race(daemons: list[Daemon], *args: str) -> list[dict[str, Any]]:
    """``conduit work submit … --json`` processes, two per daemon, started together."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "conduit_core.cli", "work", "submit", *args, "--json",
             "--config", str(d.config)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=d.root,
        )
        for d in daemons * (4 // len(daemons))
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outs.append(json.loads(out))
    return outs


def _all_work(daemon: Daemon) -> list[Any]:
    return daemon.api().request("GET", "/v1/work?limit=500", None, WorkPage).items


def _racing_daemons(make_daemon: Callable[..., Daemon], store: str) -> list[Daemon]:
    first = make_daemon()
    first.write_config(extra=_extra(first.side))
    first.start()
    if "://" not in store:
        return [first]  # SQLite: one store file, one daemon (its submitters still race)
    second = make_daemon()
    second.write_config(extra=_extra(second.side))
    return [first, second.start()]


@pytest.mark.slow
def test_racing_submitters_get_one_work(make_daemon: Callable[..., Daemon], store: str) -> None:
    daemons = _racing_daemons(make_daemon, store)
    answers = _race(daemons, lambda n: {
        "binding": "held", "id": f"race-{n:02d}", "dedup_key": "order-7", "dedup": "active",
    })  # fmt: skip
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] * (RACERS - 1) + [201], answers
    ids = {body["work"]["id"] for _, body in answers}
    assert len(ids) == 1
    (work_id,) = ids
    assert [body["deduplicated"] for status, body in answers if status == 200] == [True] * (
        RACERS - 1
    )
    assert [w.id for w in _all_work(daemons[0])] == [work_id]
    # The CLI's submitters (processes, on every daemon) join it too while it runs.
    daemons[0].wait_attempt(work_id, "running")
    outs = _cli_race(daemons, "held", "--dedup-key", "order-7", "--dedup", "active")
    assert {(o["work"]["id"], o["deduplicated"]) for o in outs} == {(work_id, True)}
    daemons[0].release(work_id)
    daemons[0].wait_status(work_id, "completed")
    assert daemons[0].runs(work_id, "start") == 1
    assert [w.id for w in _all_work(daemons[0])] == [work_id]


@pytest.mark.slow
def test_binding_template_dedups_by_input(make_daemon: Callable[..., Daemon], store: str) -> None:
    daemons = _racing_daemons(make_daemon, store)
    answers = _race(daemons, lambda n: {"binding": "dedup_order", "input": {"order": n % 2}})
    by_key: dict[str, set[str]] = {}
    for status, body in answers:
        assert status in (200, 201), body
        by_key.setdefault(body["work"]["dedup_key"], set()).add(body["work"]["id"])
    assert sorted(by_key) == ["order-0", "order-1"]
    assert all(len(ids) == 1 for ids in by_key.values())
    assert sum(status == 201 for status, _ in answers) == 2
    status, body = _post(daemons[0], {"binding": "dedup_order", "input": {"item": 1}})
    assert (status, body["code"]) == (400, "key_field_missing"), body
    assert "order" in body["error"]
    assert len(_all_work(daemons[0])) == 2  # the refusal stored nothing


def _submit_debounced(daemon: Daemon, n: int, group: str = "a") -> tuple[int, dict[str, Any]]:
    return _post(daemon, {"binding": "debounced", "input": {"group": group, "n": n}})


@pytest.mark.slow
def test_debounce_burst_runs_once_after_quiet(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon()
    daemon.write_config(extra=_extra(daemon.side, quiet="1500ms"))
    daemon.start()
    answers = []
    for n in range(5):
        last_ms = int(time.time() * 1000)  # the last submit is accepted at or after this
        answers.append(_submit_debounced(daemon, n))
        time.sleep(0.1)  # a burst: each submit within the quiet period of the last
    ids = {body["work"]["id"] for _, body in answers}
    assert len(ids) == 1
    (work_id,) = ids
    assert [s for s, _ in answers] == [201, 200, 200, 200, 200]
    shown = daemon.show(work_id)
    assert shown.waiting is not None
    assert shown.waiting.code == "debounced"
    held = shown.work
    assert held.pending_inputs == 5
    assert held.debounce_until_ms is not None
    assert held.debounce_until_ms >= last_ms + 1500  # pushed by the last submit
    detail = daemon.wait_status(work_id, "completed", timeout=30)
    assert detail.attempts[0].started_at_ms >= held.debounce_until_ms
    assert daemon.runs(work_id) == 1
    assert len(_all_work(daemon)) == 1
    # After the release, the same key starts a new Work.
    status, body = _submit_debounced(daemon, 9)
    assert status == 201
    assert body["work"]["id"] != work_id


@pytest.mark.slow
def test_debounce_max_wait_bounds_a_continuous_stream(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon()
    daemon.write_config(extra=_extra(daemon.side, quiet="1s", max_wait="3s"))
    daemon.start()
    first_status, first = _submit_debounced(daemon, 0)
    assert first_status == 201
    work_id = first["work"]["id"]
    deadline_ms = first["work"]["created_at_ms"] + 3000
    started: dict[str, Any] = {}
    n = 0
    stream_end = time.monotonic() + 6
    while time.monotonic() < stream_end:  # a submit every 0.3 s: never quiet for 1 s
        n += 1
        _submit_debounced(daemon, n)
        detail = daemon.show(work_id)
        if detail.attempts and not started:
            started["at"] = detail.attempts[0].started_at_ms
        time.sleep(0.3)
    detail = daemon.wait_status(work_id, "completed")
    start_ms = detail.attempts[0].started_at_ms
    # the stream went on until first + 6 s: without max_wait it would start after first + 7 s
    assert deadline_ms <= start_ms < deadline_ms + 3000, (deadline_ms, start_ms)
    assert started, "the stream kept the Work from starting: max_wait not applied"
    # Submits after the release made later Work, each bounded the same way.
    assert len(_all_work(daemon)) >= 2


@pytest.mark.slow
def test_debounce_survives_a_daemon_kill(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon()
    # quiet = max_wait: the submit after the restart joins without pushing the start further
    daemon.write_config(extra=_extra(daemon.side, quiet="10s", max_wait="10s"))
    daemon.start()
    status, body = _submit_debounced(daemon, 0)
    assert status == 201
    work_id = body["work"]["id"]
    due = daemon.show(work_id).work.debounce_until_ms
    assert due is not None
    daemon.kill()
    daemon.start()
    held = daemon.show(work_id)
    assert time.time() * 1000 < due, "the restart took the whole quiet period"
    assert (str(held.work.status), held.work.debounce_until_ms) == ("ready", due)
    assert not held.attempts
    # a submit after the restart still joins it (the key and the hold are in the store)
    joined_status, joined = _submit_debounced(daemon, 1)
    assert (joined_status, joined["work"]["id"]) == (200, work_id)
    detail = daemon.wait_status(work_id, "completed", timeout=30)
    assert detail.attempts[0].started_at_ms >= due
    assert daemon.runs(work_id) == 1


def test_bad_keys_are_refused_with_their_field(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon()
    daemon.write_config(extra=_extra(daemon.side))
    daemon.start()
    cases = [
        ({"binding": "ok", "dedup_key": "k", "debounce": {"key": "k", "quiet": "1s"}},
         "dedup_and_debounce"),
        ({"binding": "ok", "dedup_key": "k", "dedup": "queued", "dedup_window": "1m"},
         "invalid_value"),
        ({"binding": "ok", "dedup": "active"}, "dedup_without_key"),
        ({"binding": "ok", "dedup_key": "k", "dedup_window": "10 minutes"}, "invalid_body"),
        ({"binding": "ok", "debounce": {"key": "k", "quiet": "2s", "max_wait": "1s"}},
         "invalid_duration"),
    ]  # fmt: skip
    for body, code in cases:
        status, answer = _post(daemon, body)
        assert (status, answer.get("code")) == (400, code), (body, answer)
    assert _all_work(daemon) == []


# --- the negative control ------------------------------------------------------------------

#: Each keyed submit waits between reading the key's row and committing: racers overlap.
WIDENED = {"CONDUIT_TEST_FAULT": "store.submit_key_read:sleep=0.3"}
K, N = 2, 3


def _two_daemons(make_daemon: Callable[..., Daemon], env: dict[str, str]) -> list[Daemon]:
    pair = [make_daemon(), make_daemon()]
    for daemon in pair:
        daemon.write_config(extra=_extra(daemon.side))
        daemon.start(env=env)
    return pair


def _keyed_race(daemons: list[Daemon], key: str) -> set[str]:
    answers = _race(daemons, lambda n: {
        "binding": "held", "dedup_key": key, "dedup": "active",
    })  # fmt: skip
    assert all(status in (200, 201) for status, _ in answers), answers
    return {body["work"]["id"] for _, body in answers}


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_two_daemons_keep_one_work_under_a_widened_race(
    make_daemon: Callable[..., Daemon], store: str
) -> None:
    daemons = _two_daemons(make_daemon, WIDENED)
    for run in range(2):
        assert len(_keyed_race(daemons, f"widened-{run}")) == 1


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("store", ["postgres"], indirect=True)
def test_negative_control_without_the_key_lock_racers_create_several(
    make_daemon: Callable[..., Daemon], store: str
) -> None:
    """``submit_key_lock`` off: the same race creates more than one Work (K of N runs)."""
    daemons = _two_daemons(make_daemon, {"CONDUIT_TEST_UNSAFE": "submit_key_lock", **WIDENED})
    seen: list[bool] = []
    while len(seen) < N and K > sum(seen) >= K - (N - len(seen)):
        seen.append(len(_keyed_race(daemons, f"unsafe-{len(seen)}")) > 1)
    assert sum(seen) >= K, f"the detector saw the duplicate in {sum(seen)} of {len(seen)} runs"


# --- the Python client and the embedded scheduler ----------------------------------------------


def test_the_client_submits_under_keys(make_daemon: Callable[..., Daemon]) -> None:
    from conduit_core.client import Client, Debounce, SubmitItem

    daemon = make_daemon()
    daemon.write_config(extra=_extra(daemon.side))
    daemon.start()
    with Client(config=daemon.config) as client:
        first = client.submit("held", dedup_key="c-1", dedup="active")
        again = client.submit("held", {"x": 1}, dedup_key="c-1", dedup="active")
        assert (first.deduplicated, again.deduplicated) == (False, True)
        assert again.work.id == first.work.id
        assert again.work.dedup_key == "c-1"
        held = client.submit("ok", debounce=Debounce(key="b", quiet="1m"))
        assert held.work.debounce_until_ms is not None
        batch = client.submit_many([
            SubmitItem(binding="held", dedup_key="c-1", dedup="active"),
            SubmitItem(binding="ok", debounce=Debounce(key="b", quiet="1m")),
            SubmitItem(binding="held", dedup_key="c-2"),
            SubmitItem(binding="held", dedup_key="c-3", dedup="active", dedup_window="1m"),
        ])  # fmt: skip
        assert [(i.id, i.created, i.deduplicated) for i in batch.items[:3]] == [
            (first.work.id, False, True), (held.work.id, False, True),
            (batch.items[2].id, True, False),
        ]  # fmt: skip
        assert batch.items[3].code == "invalid_value"  # refused alone, the others decided
        assert (batch.created, batch.deduplicated, batch.refused) == (1, 2, 1)
        assert client.get(held.work.id).work.pending_inputs == 2


@pytest.mark.anyio
async def test_the_embedded_scheduler_answers_deduplicated(tmp_path: Any) -> None:
    from conduit_core import embed

    config = tmp_path / "conduit.toml"
    config.write_text(
        f'[settings]\nstore = "{tmp_path}/conduit.db"\ndata_dir = "{tmp_path}/data"\n'
        '[bindings.later]\nexecutor = "shell"\nconfig = { command = "true" }\n'
        'debounce = { key = "k-{n}", quiet = "1h" }\n'
    )
    async with embed.run(config, rescan_s=0.2) as scheduler:
        made = await scheduler.submit("later", {"n": 1})
        joined = await scheduler.submit("later", {"n": 1})
        other = await scheduler.submit("later", {"n": 2})
        assert (made.deduplicated, joined.deduplicated, other.deduplicated) == (False, True, False)
        assert joined.work.id == made.work.id != other.work.id
        assert (await scheduler.get(made.work.id)).work.pending_inputs == 2


def _key_rows(store: str) -> dict[str, str]:
    """Every dedup and debounce key row on the daemon's store: key -> the Work it names."""

    async def read() -> dict[str, str]:
        async with await open_store(store) as handle:
            assert isinstance(handle, SqlStore)
            rows = handle.transaction(
                lambda cx: cx.rows("SELECT submit_key, work_id FROM conduit_submit_key"),
                write=False,
            )
        return {str(key): str(work_id) for key, work_id in rows}

    return anyio.run(read)


def test_key_rows_of_ended_work_are_released(
    make_daemon: Callable[..., Daemon], store: str
) -> None:
    """200 Work under 200 distinct keys run and end: the daemon's sweep releases their rows, so
    the key table holds only the keys that still name something (a held job's, an open
    window's)."""
    daemon = make_daemon(concurrency=32, job_concurrency=32)
    daemon.write_config(extra=_extra(daemon.side))
    daemon.start()
    with Client(config=daemon.config) as client:
        held = client.submit("held", dedup_key="still-running", dedup="active").work.id
        client.submit("ok", dedup_key="in-window", dedup_window="1h")
        batch = client.submit_many(
            [SubmitItem(binding="dedup_order", input={"order": n}) for n in range(190)]
            + [SubmitItem(binding="ok", debounce=Debounce(key=f"d-{n}", quiet="500ms"))
               for n in range(10)]
        )  # fmt: skip
        assert batch.created == 200
        outcomes = client.wait_many(batch.ids, timeout=120)
        assert {o.status for o in outcomes} == {"completed"}
    wait_for(
        "the ended Work's key rows to be released",
        lambda: set(_key_rows(daemon.store)) == {"still-running", "in-window"},
        timeout=30,
    )
    # The kept keys still answer with their Work; a released key creates a new one.
    status, body = _post(daemon, {"binding": "held", "dedup_key": "still-running",
                                  "dedup": "active"})  # fmt: skip
    assert (status, body["work"]["id"]) == (200, held)
    status, body = _post(daemon, {"binding": "dedup_order", "input": {"order": 7}})
    assert (status, body["deduplicated"]) == (201, False)
    daemon.release(held)
