"""Bulk submit through a real daemon, on SQLite and PostgreSQL: ``POST /v1/work/batch`` decides
each item on its own, refuses an oversized batch whole, and ``conduit work submit --from`` names
bad lines and stores nothing for them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import msgspec

from conduit_core.http import (
    MAX_BATCH_ITEMS,
    BatchSubmitRequest,
    BatchSubmitResult,
    SubmitRequest,
    WorkPage,
    new_work_id,
)
from conduit_core.validation import MAX_PAYLOAD_BYTES, check_work_id
from tests.daemon.conftest import Daemon, wait_for


def all_work(daemon: Daemon) -> list[str]:
    page = daemon.api().request("GET", "/v1/work?limit=500", None, WorkPage)
    return [w.id for w in page.items]


def submit_batch(daemon: Daemon, items: list[SubmitRequest]) -> BatchSubmitResult:
    req = BatchSubmitRequest(items=items)
    return daemon.api().request("POST", "/v1/work/batch", req, BatchSubmitResult)


def test_a_batch_decides_each_item_and_the_created_ones_run(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon().start()
    daemon.submit("ok", id="taken")
    result = submit_batch(
        daemon,
        [
            SubmitRequest(binding="ok", input={"n": 0}),
            SubmitRequest(binding="ok", id="mine"),
            SubmitRequest(binding="nope"),
            SubmitRequest(binding="ok", id="taken"),
            SubmitRequest(binding="ok", id="mine"),  # the same id twice in one batch
            SubmitRequest(binding="ok", scope="nowhere"),
            SubmitRequest(binding="ok", input="x" * MAX_PAYLOAD_BYTES),
        ],
    )
    codes = [(item.index, item.created, item.code) for item in result.items]
    assert codes == [
        (0, True, None),
        (1, True, None),
        (2, False, "unknown_binding"),
        (3, False, "work_exists"),
        (4, False, "work_exists"),
        (5, False, "unknown_scope"),
        (6, False, "too_large"),
    ]
    assert (result.created, result.refused) == (2, 5)
    assert result.items[1].id == "mine"
    assert "nope" in (result.items[2].error or "")
    generated = result.items[0].id
    assert generated is not None
    for work_id in (generated, "mine"):
        daemon.wait_status(work_id, "completed")
        assert daemon.runs(work_id) == 1
    assert sorted(all_work(daemon)) == sorted([generated, "mine", "taken"])


def test_generated_ids_never_collide_in_a_full_batch(make_daemon: Callable[..., Daemon]) -> None:
    """A full batch takes one timestamp for all its items; with 24 random bits per id a few of
    1,000 ids of one millisecond collided now and then (``work_exists``)."""
    daemon = make_daemon(concurrency=1).start()
    result = submit_batch(daemon, [SubmitRequest(binding="echo")] * MAX_BATCH_ITEMS)
    assert (result.created, result.refused) == (MAX_BATCH_ITEMS, 0)
    ids = [item.id for item in result.items]
    assert ids == sorted(ids)  # time-ordered, in submit order


def test_ids_of_one_millisecond_are_distinct_and_ordered() -> None:
    ids = [new_work_id(1_000) for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    later = new_work_id(900)  # the clock stepped back: still after every id before it
    assert later > ids[-1]
    assert all(check_work_id(i, "id") == i for i in (ids[0], ids[-1], later))


def test_a_forked_child_draws_its_own_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id of the same millisecond, to the parent
        os.write(write, new_work_id(5_000).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    os.close(read)
    assert child != new_work_id(5_000)


def test_an_oversized_or_malformed_batch_is_refused_whole(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon().start()
    over = msgspec.json.encode({"items": [{"binding": "ok"}] * (MAX_BATCH_ITEMS + 1)})
    status, error = daemon.raw("POST", "/v1/work/batch", over)
    assert (status, error["code"]) == (400, "too_many_items")
    assert str(MAX_BATCH_ITEMS) in error["error"]
    malformed = b'{"items": [{"binding": "ok"}, {"binding": "ok", "id": "../x"}]}'
    status, error = daemon.raw("POST", "/v1/work/batch", malformed)
    assert (status, error["code"]) == (400, "invalid_body")
    assert "$.items[1].id" in error["error"]
    assert all_work(daemon) == []


def test_the_batch_path_serves_only_post(make_daemon: Callable[..., Daemon]) -> None:
    """A literal path shadows the template it matches (as OpenAPI reads paths): ``GET
    /v1/work/batch`` is not a lookup of Work ``batch``, and ``Allow`` names POST alone."""
    daemon = make_daemon().start()
    daemon.submit("ok", id="batch")
    for method in ("GET", "OPTIONS", "DELETE"):
        status, error = daemon.raw(method, "/v1/work/batch")
        assert (status, error["code"]) == (405, "method_not_allowed"), method
        assert "allowed: POST)" in error["error"]
    assert daemon.raw("GET", "/v1/work/w-1")[0] == 404  # other ids are still looked up


def test_submit_from_a_jsonl_file(make_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    daemon = make_daemon().start()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"binding": "ok"}\n\n{"binding": "ok", "input": \n{"binding": 3}\n')
    done = daemon.cli("work", "submit", "--from", str(bad), check=False)
    assert done.returncode == 1
    for named in ("line 3:", "line 4:", "invalid_jsonl", "nothing was submitted"):
        assert named in done.stderr, done.stderr
    assert "line 1:" not in done.stderr
    assert all_work(daemon) == []

    both = daemon.cli("work", "submit", "ok", "--from", str(bad), check=False)
    assert (both.returncode, "BINDING" in both.stderr) == (2, True)

    lines = [{"binding": "ok", "input": {"n": n}} for n in range(3)]
    lines.insert(1, {"binding": "nope", "id": "x1"})
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = daemon.cli("work", "submit", "--from", str(good), "--json", check=False)
    assert done.returncode == 1  # one line was refused
    outcomes = json.loads(done.stdout)
    assert [(o["line"], o["created"], o["code"]) for o in outcomes] == [
        (1, True, None), (2, False, "unknown_binding"), (3, True, None), (4, True, None),
    ]  # fmt: skip
    created = [o["id"] for o in outcomes if o["created"]]
    for work_id in created:
        daemon.wait_status(work_id, "completed")
    assert sorted(all_work(daemon)) == sorted(created)


def test_submit_from_a_file_without_a_daemon(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """Direct mode (no daemon runs): the same batch path on the store; a daemon started later
    runs what was stored."""
    daemon = make_daemon()
    good = tmp_path / "good.jsonl"
    good.write_text('{"binding": "ok", "id": "a"}\n{"binding": "ok", "id": "b"}\n')
    done = daemon.cli("work", "submit", "--from", str(good))
    assert "submitted 2, refused 0" in done.stdout
    daemon.start()
    for work_id in ("a", "b"):
        daemon.wait_status(work_id, "completed")
    wait_for("both runs", lambda: daemon.runs("a") == 1 and daemon.runs("b") == 1)
