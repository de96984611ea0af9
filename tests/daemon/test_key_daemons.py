"""Concurrency keys through real daemons (issue 36): never more than ``key_limit`` jobs of one
key alive at once, across every daemon; a key at its limit keeps no other key's Work waiting.

Measured from the jobs themselves, as tests/daemon/test_capacity_daemons.py measures capacity:
each job appends "<id> start <time>" when it begins and "<id> end <time>" just before it ends,
to one file shared by every daemon's jobs. Appends land in the order they happen, so walking the
file counts exactly how many jobs of each key were between their start and end at each moment.

On PostgreSQL two daemons claim from one batch at once (the one that takes the batch wakes the
other); on SQLite one daemon (one writer by nature). The negative control switches the key check
off (``CONDUIT_TEST_UNSAFE=key_check``, inherited by both daemons): the detector must see a key
over its limit in 2 of 3 runs (``bench/race_controls.py --keys`` counts it over 20).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit_core.http import BatchSubmitRequest, BatchSubmitResult, SubmitRequest
from tests.daemon.conftest import Daemon, wait_for

K, N = 2, 3  # the negative control passes when it saw a key over its limit in K of N runs
KEY_LIMIT = 2
KEYS = ("acme", "globex", "initech")
JOBS_PER_KEY = 8
#: The daemons' claims are one transaction each: no start gate is asked.
UNGATED = {"CONDUIT_TEST_PLUGIN_GATES": "selected"}


def _key_config(root: Path) -> str:
    side = root / "side-effects.log"
    stamp = "$(date +%s.%N)"
    return f"""
[bindings.keyed]
executor = "shell"
concurrency_key = "{{customer}}"
key_limit = {KEY_LIMIT}
config = {{ command = 'echo "$CONDUIT_WORK_ID start {stamp}" >> {side}; sleep 0.3; echo "$CONDUIT_WORK_ID end {stamp}" >> {side}' }}

[bindings.keyed-held]
executor = "shell"
concurrency_key = "{{customer}}"
config = {{ command = 'echo "$CONDUIT_WORK_ID start" >> {side}; while test ! -e {root}/release.$CONDUIT_WORK_ID; do sleep 0.05; done; echo "$CONDUIT_WORK_ID end" >> {side}' }}
"""


def start_daemons(
    root: Path,
    store: str,
    daemons: list[Daemon],
    env: dict[str, str] | None = None,
    *,
    count: int | None = None,
    slots: int = 32,
    gated: bool = False,
) -> list[Daemon]:
    """Two daemons on PostgreSQL, one on SQLite (or ``count``); ``slots``: the capacity, by
    default far above the keys' limits; ``gated``: each claim asks the test plugin's start
    gates (two transactions: ``admit_ready``, then ``admit_attempts``)."""
    count = count or (2 if "://" in store else 1)
    started = []
    for name in ("d1", "d2")[:count]:
        daemon = Daemon(root, store, name=name, extra=_key_config(root), concurrency=slots,
                        job_concurrency=slots)  # fmt: skip
        daemons.append(daemon)
        started.append(daemon.start(rescan=0.2, env={**({} if gated else UNGATED), **(env or {})}))
    return started


def peaks_per_key(daemon: Daemon, key_of: dict[str, str]) -> dict[str, int]:
    """The most jobs of each key alive at once, walking the start/end lines in file order."""
    alive = dict.fromkeys(key_of.values(), 0)
    peak = dict(alive)
    for line in daemon.side.read_text().splitlines():
        work_id, word = line.split()[:2]
        key = key_of.get(work_id)
        if key is not None and word in ("start", "end"):
            alive[key] += 1 if word == "start" else -1
            peak[key] = max(peak[key], alive[key])
    return peak


def run_keyed_jobs(started: list[Daemon], run: int = 0) -> dict[str, int]:
    """Submit ``JOBS_PER_KEY`` jobs of each key, interleaved, in one batch to one daemon; wait
    until all completed; each key's peak."""
    key_of = {f"r{run}-{key}-{i}": key for i in range(JOBS_PER_KEY) for key in KEYS}
    items = [SubmitRequest(binding="keyed", id=work_id, input={"customer": key})
             for work_id, key in key_of.items()]  # fmt: skip
    done = started[run % len(started)].api().request(
        "POST", "/v1/work/batch", BatchSubmitRequest(items=items), BatchSubmitResult
    )
    assert done.created == len(items), done
    first = started[0]
    for work_id in key_of:
        first.wait_status(work_id, "completed", timeout=90)
    starts = [line.split()[0] for line in first.side.read_text().splitlines()
              if line.split()[1:2] == ["start"]]  # fmt: skip
    assert all(starts.count(work_id) == 1 for work_id in key_of), "a job started twice"
    return peaks_per_key(first, key_of)


@pytest.mark.slow
@pytest.mark.parametrize("gated", [False, True], ids=["ungated", "gated"])
def test_no_key_ever_runs_more_jobs_than_its_limit(
    tmp_path: Path, store: str, daemons: list[Daemon], gated: bool
) -> None:
    peaks = run_keyed_jobs(start_daemons(tmp_path, store, daemons, gated=gated))
    assert all(p <= KEY_LIMIT for p in peaks.values()), f"peaks {peaks}, key_limit {KEY_LIMIT}"
    assert max(peaks.values()) == KEY_LIMIT, f"peaks {peaks}: no key reached its limit"


@pytest.mark.slow
def test_negative_control_without_the_key_check_a_key_runs_over_its_limit(
    tmp_path: Path, postgres_url: str, daemons: list[Daemon]
) -> None:
    started = start_daemons(tmp_path, postgres_url, daemons, {"CONDUIT_TEST_UNSAFE": "key_check"})
    runs: list[dict[str, int]] = []
    while len(runs) < N:
        seen = sum(max(p.values()) > KEY_LIMIT for p in runs)
        if seen >= K or seen + N - len(runs) < K:
            break
        runs.append(run_keyed_jobs(started, run=len(runs)))
    seen = sum(max(p.values()) > KEY_LIMIT for p in runs)
    assert seen >= K, f"peaks {runs}: the measurement cannot see a key over its limit"


def test_a_key_at_its_limit_waits_visibly_and_keeps_no_other_key_back(
    tmp_path: Path, store: str, daemons: list[Daemon]
) -> None:
    """Key ``a`` (limit 1) has five held jobs ahead of one of key ``b``, with four slots: ``b``
    starts while ``a``'s first runs, and ``a``'s second says it waits for its key."""
    # Four slots: a claim reads at most four ready rows, all of them a's without the filter.
    (daemon,) = start_daemons(tmp_path, store, daemons, count=1, slots=4)
    a = [daemon.submit("keyed-held", id=f"a{i}", input={"customer": "a"}) for i in range(5)]
    b = daemon.submit("keyed-held", id="b0", input={"customer": "b"})
    wait_for("b0 to start behind a's queued Work", lambda: daemon.runs(b, "start"), 30)
    assert daemon.runs(a[0], "start") == 1
    assert [daemon.runs(w, "start") for w in a[1:]] == [0, 0, 0, 0]
    detail = daemon.show(a[1])
    assert detail.work.concurrency_key == "a"
    assert detail.waiting is not None
    assert detail.waiting.code == "concurrency_key"
    assert detail.waiting.limit_name == "key:a"
    assert "waiting for key 'a'" in detail.waiting.message
    daemon.release(a[0])
    wait_for("a1 to start once a0 ended", lambda: daemon.runs(a[1], "start"), 30)
    for work_id in (*a, b):
        daemon.release(work_id)


def test_capacity_counts_the_work_a_key_at_its_limit_holds_back(
    tmp_path: Path, store: str, daemons: list[Daemon]
) -> None:
    """Three held jobs of key ``c`` (limit 1) and one of ``d``: ``/v1/capacity`` and ``conduit
    capacity`` show ``c`` at its limit with 2 waiting; ``d``, running within its limit, is not
    listed; once ``c``'s first job ends, 1 waits."""
    (daemon,) = start_daemons(tmp_path, store, daemons, count=1, slots=8)
    c = [daemon.submit("keyed-held", id=f"c{i}", input={"customer": "c"}) for i in range(3)]
    d = daemon.submit("keyed-held", id="d0", input={"customer": "d"})
    for work_id in (c[0], d):
        wait_for(f"{work_id} to start", lambda w=work_id: daemon.runs(w, "start"), 30)

    def key_rows() -> tuple[list[dict[str, object]], int]:
        body = daemon.raw("GET", "/v1/capacity")[1]
        return body["keys"], body["keys_waiting"]

    assert key_rows() == ([{"name": "c", "limit": 1, "in_use": 1, "waiting": 2}], 2)
    shown = [line.split() for line in daemon.cli("capacity").stdout.splitlines()]
    assert ["key", "c", "1", "1", "2"] in shown
    assert not any(row[:2] == ["key", "d"] for row in shown)
    daemon.release(c[0])
    wait_for("c1 or c2 to start once c0 ended",
             lambda: daemon.runs(c[1], "start") + daemon.runs(c[2], "start"), 30)  # fmt: skip
    assert key_rows() == ([{"name": "c", "limit": 1, "in_use": 1, "waiting": 1}], 1)
    for work_id in (*c, d):
        daemon.release(work_id)


def test_a_submit_whose_input_lacks_the_key_field_is_refused_and_stores_nothing(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    (daemon,) = start_daemons(tmp_path, str(tmp_path / "conduit.db"), daemons)
    for body in (b'{"binding": "keyed", "id": "x1", "input": {"client": "a"}}',
                 b'{"binding": "keyed", "id": "x2", "input": 7}'):  # fmt: skip
        status, answer = daemon.raw("POST", "/v1/work", body)
        assert status == 422, answer
        assert answer["code"] == "concurrency_key_field_missing", answer
        assert "customer" in answer["error"], answer
    status, answer = daemon.raw(
        "POST", "/v1/work", b'{"binding": "keyed", "id": "x3", "input": {"customer": [1]}}'
    )
    assert (status, answer["code"]) == (422, "invalid_concurrency_key"), answer
    status, page = daemon.raw("GET", "/v1/work")
    assert status == 200
    assert page["items"] == []


def test_priority_from_the_cli_the_api_and_the_binding(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    (daemon,) = start_daemons(tmp_path, str(tmp_path / "conduit.db"), daemons)
    daemon.cli("work", "submit", "ok", "--id", "p-cli", "--priority", "7")
    assert daemon.show("p-cli").work.priority == 7
    daemon.submit("ok", id="p-api", priority=-3)
    assert daemon.show("p-api").work.priority == -3
    daemon.submit("ok", id="p-default")
    assert daemon.show("p-default").work.priority == 0
    status, answer = daemon.raw("POST", "/v1/work", b'{"binding": "ok", "priority": 11}')
    assert status == 400, answer
    refused = daemon.cli("work", "submit", "ok", "--priority", "11", check=False)
    assert refused.returncode != 0


def test_the_daemon_unparks_what_a_racing_write_left_parked(
    tmp_path: Path, store: str, daemons: list[Daemon]
) -> None:
    """A Work of key ``s`` stored parked while its key has room, as a parking that committed
    beside the write freeing the key's last place leaves it on PostgreSQL (nothing will write
    the key again): the daemon's sweep unparks it, and it starts."""
    import anyio
    import msgspec

    from conduit_core.model import WorkKind
    from conduit_core.storage import open_store_sync
    from conduit_core.storage._ops_work import create_work
    from conduit_core.storage.conformance import make_input, make_work

    (daemon,) = start_daemons(tmp_path, store, daemons, count=1, slots=4)
    work = msgspec.structs.replace(
        make_work("s1", kind=WorkKind.TASK), binding="keyed-held", concurrency_key="s",
        key_limit=1,
    )
    first_input = msgspec.structs.replace(make_input("s1-in"), payload={"customer": "s"})

    def stranded(cx: object) -> None:
        create_work(cx, work, first_input)  # type: ignore[arg-type]
        cx.run("UPDATE conduit_work SET key_parked = 1 WHERE id = 's1'")  # type: ignore[attr-defined]

    handle = open_store_sync(store if "://" in store else Path(store))
    try:
        handle.transaction(stranded)  # type: ignore[attr-defined]
    finally:
        anyio.run(handle.aclose)
    wait_for("s1 to start, unparked by the sweep", lambda: daemon.runs("s1", "start"), 30)
    daemon.release("s1")
    daemon.wait_status("s1", "completed", timeout=30)
