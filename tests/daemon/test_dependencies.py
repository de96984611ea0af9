"""Dependencies (``after``) through real daemons on both stores: a diamond that survives a
``kill -9`` of its daemon, the failure policies, and the refusals that store nothing."""

from __future__ import annotations

import itertools
import signal
from collections.abc import Callable
from typing import Any

import msgspec

from tests.daemon.conftest import Daemon, wait_for

#: A binding whose job fails at once and for good (no retry: the Work ends ``failed``).
FAILS = """
[bindings.fails]
executor = "shell"
retry_delays_seconds = []
terminal_on_exhaustion = true
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}; exit 4' }}
"""


def _batch(daemon: Daemon, *items: dict[str, Any]) -> dict[str, Any]:
    status, body = daemon.raw(
        "POST", "/v1/work/batch", msgspec.json.encode({"items": list(items)})
    )
    assert status == 200, body
    return body


def _history(daemon: Daemon, work_id: str) -> list[str]:
    status, page = daemon.raw("GET", f"/v1/work/{work_id}/history")
    assert status == 200, page
    return [entry["summary"] for entry in page["items"]]


def _lines(daemon: Daemon) -> list[str]:
    return daemon.side.read_text().splitlines() if daemon.side.exists() else []


def test_diamond_survives_kill_9_every_job_once_d_after_b_and_c(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(lease=2).start()
    held = {"binding": "held"}
    body = _batch(
        daemon,
        {**held, "id": "d"} | {"after": ["b", "c"]},  # listed first: order in a batch is free
        {**held, "id": "b", "after": ["a"]},
        {**held, "id": "c", "after": ["a"]},
        {**held, "id": "a"},
    )
    assert body["created"] == 4, body
    wait_for("a to start", lambda: daemon.runs("a", "start") == 1)
    waiting = daemon.show("d").waiting
    assert waiting is not None
    assert (waiting.code, waiting.message) == ("dependency", "waiting for work b, c")
    assert daemon.show("b").waiting.message == "waiting for work a"  # type: ignore[union-attr]
    assert daemon.show("d").work.waiting_for == ["b", "c"]

    daemon.release("a")
    wait_for("b and c to start", lambda: daemon.runs("b", "start") == daemon.runs("c", "start") == 1)
    daemon.signal(signal.SIGKILL)  # while b and c run
    daemon.wait_exit()
    daemon.release("b")  # b's job ends while no daemon runs
    wait_for("b's job to end", lambda: daemon.runs("b", "end") == 1)

    daemon.start()
    daemon.wait_status("b", "completed", timeout=45)
    assert daemon.show("d").work.waiting_for == ["c"]
    assert daemon.runs("d", "start") == 0
    daemon.release("c")
    wait_for("d to start", lambda: daemon.runs("d", "start") == 1, timeout=45)
    daemon.release("d")
    daemon.wait_status("d", "completed", timeout=45)

    lines = _lines(daemon)
    for work_id in "abcd":
        assert daemon.runs(work_id, "start") == 1, lines
        assert daemon.runs(work_id, "end") == 1, lines
    d_start = lines.index("d start")
    assert lines.index("b end") < d_start
    assert lines.index("c end") < d_start
    assert lines.index("a end") < min(lines.index("b start"), lines.index("c start"))


def _failure_setup(make_daemon: Callable[..., Daemon]) -> Daemon:
    daemon = make_daemon()
    daemon.write_config(extra=FAILS.format(side=daemon.side))
    return daemon.start()


def test_failure_cancels_dependents_and_theirs(make_daemon: Callable[..., Daemon]) -> None:
    daemon = _failure_setup(make_daemon)
    _batch(
        daemon,
        {"binding": "fails", "id": "a"},
        {"binding": "ok", "id": "b", "after": ["a"]},  # default policy: cancel
        {"binding": "ok", "id": "c", "after": ["b"], "on_dependency_failure": "run"},
    )
    daemon.wait_status("a", "failed")
    b = daemon.wait_status("b", "cancelled")
    assert b.work.dependency_failed == "a"
    assert "work a ended failed: cancelled" in _history(daemon, "b")
    # c would run on b's failure, but b was cancelled by a's: c runs (its own policy decides).
    daemon.wait_status("c", "completed")
    assert daemon.runs("b") == 0
    assert daemon.runs("c") == 1


def test_failure_cascades_cancel_down_a_chain(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    ids = [f"w{i}" for i in range(6)]
    _batch(
        daemon,
        {"binding": "held", "id": ids[0]},
        *({"binding": "ok", "id": w, "after": [prev]} for prev, w in itertools.pairwise(ids)),
    )
    wait_for("w0 to start", lambda: daemon.runs("w0", "start") == 1)
    daemon.cli("work", "cancel", "w0")
    for work_id in ids[1:]:
        detail = daemon.wait_status(work_id, "cancelled")
        assert detail.attempts == []
    assert all(daemon.runs(w) == 0 for w in ids[1:])


def test_failure_holds_dependent_for_a_person(make_daemon: Callable[..., Daemon]) -> None:
    daemon = _failure_setup(make_daemon)
    _batch(
        daemon,
        {"binding": "fails", "id": "a"},
        {"binding": "ok", "id": "b", "after": ["a"], "on_dependency_failure": "hold"},
    )
    daemon.wait_status("a", "failed")

    def held() -> Any:
        detail = daemon.show("b")
        return detail if detail.work.blocked_reason == "dependency_failed" else None

    detail = wait_for("b to be held", held)
    assert str(detail.work.status) == "ready"
    assert detail.waiting is not None
    assert detail.waiting.code == "dependency_failed"
    assert "conduit work retry b" in detail.waiting.message
    shown = daemon.cli("work", "show", "b").stdout
    assert "did not complete" in shown
    assert "work a ended failed: held for a person" in _history(daemon, "b")
    assert daemon.runs("b") == 0
    daemon.cli("work", "retry", "b")  # the person decides: run it anyway
    daemon.wait_status("b", "completed")
    assert daemon.runs("b") == 1


def test_failure_runs_dependent_anyway(make_daemon: Callable[..., Daemon]) -> None:
    daemon = _failure_setup(make_daemon)
    _batch(
        daemon,
        {"binding": "fails", "id": "a"},
        {"binding": "ok", "id": "b", "after": ["a"], "on_dependency_failure": "run"},
    )
    daemon.wait_status("a", "failed")
    daemon.wait_status("b", "completed")
    lines = _lines(daemon)
    assert lines.index("a run") < lines.index("b run")


def test_after_ended_dependency_decides_at_submit(make_daemon: Callable[..., Daemon]) -> None:
    daemon = _failure_setup(make_daemon)
    daemon.submit("ok", id="done")
    daemon.submit("fails", id="bad")
    daemon.wait_status("done", "completed")
    daemon.wait_status("bad", "failed")
    daemon.submit("ok", id="x", after=["done"])
    daemon.submit("ok", id="y", after=["bad"])
    daemon.cli("work", "submit", "ok", "--id", "z", "--after", "bad",
               "--on-dependency-failure", "run")  # fmt: skip
    daemon.wait_status("x", "completed")
    assert daemon.show("y").work.status == "cancelled"
    daemon.wait_status("z", "completed")


def test_unknown_and_cycle_refused_store_untouched(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    daemon.submit("ok", id="known")
    daemon.wait_status("known", "completed")
    before = daemon.api().request("GET", "/v1/work?limit=500", None, dict)

    status, body = daemon.raw("POST", "/v1/work", msgspec.json.encode(
        {"binding": "ok", "id": "u", "after": ["known", "nowhere"]}))  # fmt: skip
    assert status == 422, body
    assert body["code"] == "dependency_unknown"
    assert "'nowhere'" in body["error"]

    status, body = daemon.raw("POST", "/v1/work", msgspec.json.encode(
        {"binding": "ok", "id": "self", "after": ["self"]}))  # fmt: skip
    assert (status, body["code"]) == (422, "dependency_cycle"), body
    assert "'self'" in body["error"]

    body = _batch(
        daemon,
        {"binding": "ok", "id": "p", "after": ["q"]},
        {"binding": "ok", "id": "q", "after": ["r"]},
        {"binding": "ok", "id": "r", "after": ["p"]},
        {"binding": "ok", "id": "s", "after": ["p"]},  # downstream of the cycle
        {"binding": "ok", "id": "t", "after": ["gone"]},
        {"binding": "ok", "id": "v", "after": ["t"]},
    )
    assert body["created"] == 0, body
    codes = {item["id"]: item["code"] for item in body["items"]}
    assert codes == {
        "p": "dependency_cycle", "q": "dependency_cycle", "r": "dependency_cycle",
        "s": "dependency_cycle", "t": "dependency_unknown", "v": "dependency_unknown",
    }  # fmt: skip
    assert "'gone'" in next(i["error"] for i in body["items"] if i["id"] == "t")

    done = daemon.cli("work", "submit", "ok", "--id", "c1", "--after", "nowhere", check=False)
    assert done.returncode != 0
    assert "dependency_unknown" in done.stderr + done.stdout

    after = daemon.api().request("GET", "/v1/work?limit=500", None, dict)
    assert after["items"] == before["items"]
    for work_id in ("u", "self", "p", "s", "t", "c1"):
        status, body = daemon.raw("GET", f"/v1/work/{work_id}")
        assert status == 404, (work_id, body)


GROUP = """
[[routines]]
id = "group"
cron = "* * * * * *"
binding = "sleeper"
input = { step = "extract" }

[[routines.then]]
binding = "ok"
input = { step = "load" }
"""


def test_a_routine_group_fires_its_steps_in_order(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon(extra=GROUP, sleep=0.3).start()

    def chained_run() -> str | None:
        return next((line for line in _lines(daemon) if line.endswith(".2 run")), None)

    line = wait_for("the group's second step to run", chained_run)
    second = line.split()[0]
    first = second.removesuffix(".2")
    lines = _lines(daemon)
    assert lines.index(f"{first} end") < lines.index(f"{second} run")
    detail = daemon.show(second)
    assert detail.work.after == [first]
    assert detail.work.scheduled_by == "routine:group"
    daemon.wait_status(second, "completed")
    assert daemon.runs(first, "start") == 1
    assert daemon.runs(second) == 1

    def settled() -> dict[str, Any] | None:
        status, fires = daemon.raw("GET", "/v1/schedules/conduit:group/history")
        assert status == 200, fires
        return next((f for f in fires if f["work_id"] == second and f["outcome"] == "completed"),
                    None)  # fmt: skip

    # The Routine's fire is the group: it settles when the last step ends.
    wait_for("the group's fire to settle on its last step", settled)


def test_the_python_client_submits_after(make_daemon: Callable[..., Daemon]) -> None:
    from conduit_core.client import Client, SubmitItem

    daemon = make_daemon().start()
    with Client(config=daemon.config) as client:
        client.submit("held", id="first")
        detail = client.submit("ok", id="second", after=["first"], on_dependency_failure="hold")
        assert detail.work.waiting_for == ["first"]
        assert detail.work.on_dependency_failure == "hold"
        assert detail.waiting is not None
        assert detail.waiting.message == "waiting for work first"
        result = client.submit_many([
            SubmitItem(binding="ok", id="late", after=["early"]),
            SubmitItem(binding="ok", id="early", after=["second"]),
        ])  # fmt: skip
        assert result.created == 2
        daemon.release("first")
        assert client.wait("late", timeout=30).ok
    lines = _lines(daemon)
    assert lines.index("second run") < lines.index("early run") < lines.index("late run")
