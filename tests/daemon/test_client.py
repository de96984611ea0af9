"""The public Python client (``conduit_core.client``) against a real daemon, on both stores.

Sync and async clients: submit, wait for the typed result, bulk submit, list paging, cancel,
retry, the human gate, inputs, and errors raised with the API's stable code.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from conduit_core.client import (
    AsyncClient,
    Client,
    ConduitClientError,
    Conflict,
    DaemonUnavailable,
    InvalidRequest,
    NotFound,
    SubmitItem,
    Unauthorized,
    WaitTimeout,
)
from tests.daemon.conftest import Daemon, wait_for

REPO = Path(__file__).resolve().parents[2]

EXTRA = """
[bindings.deploy]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}' }}

[bindings.echo-back]
executor = "shell"
config = {{ command = "read -r event; printf '{{\\"outcome\\": \\"completed\\", \\"data\\": {{\\"event\\": %s}}}}' \\"$event\\" > \\"$CONDUIT_RESULT\\"" }}
"""


class Order(msgspec.Struct):
    n: int


class Echo(msgspec.Struct):
    """The echo executor's data: every input payload it was given."""

    inputs: list[Order]


def start(
    make_daemon: Callable[..., Daemon], tmp_path: Path, mp: pytest.MonkeyPatch, **settings: Any
) -> Daemon:
    rules = tmp_path / "human.toml"
    rules.write_text('[[rules]]\nbindings = ["deploy"]\nreason = "deploys need a person"\n')
    mp.setenv("CONDUIT_HUMAN_GATE_CONFIG", str(rules))
    extra = EXTRA.format(side=tmp_path / "side-effects.log")
    return make_daemon(extra=extra, **settings).start()


def url(daemon: Daemon) -> str:
    return f"http://127.0.0.1:{daemon.port}"


def test_sync_client_submits_waits_for_typed_data_and_raises_coded_errors(
    make_daemon: Callable[..., Daemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = start(make_daemon, tmp_path, monkeypatch)
    # Found from the daemon's config file (as the CLI finds it), then from the environment.
    with Client(config=daemon.config) as client:
        assert client.health()["status"] == "ok"
    monkeypatch.setenv("CONDUIT_URL", url(daemon))
    monkeypatch.setenv("CONDUIT_TOKEN", daemon.token)
    client = Client(config=tmp_path / "absent.toml")  # never read: both come from the env
    with Client(url(daemon), token="wrong") as wrong, pytest.raises(Unauthorized) as bad_token:
        wrong.get("x")
    assert bad_token.value.code == "unauthorized"

    work = client.submit("echo", {"n": 7})
    assert work.work.binding == "echo"
    outcome = client.wait(work.work.id, timeout=30, data_type=Echo)
    assert outcome.ok
    assert outcome.status == "completed"
    assert outcome.data == Echo(inputs=[Order(n=7)])
    assert outcome.raw_data == {"inputs": [{"n": 7}]}
    assert client.get(work.work.id).work.status == "completed"
    # Data that does not fit the caller's type is a coded error naming the Work.
    with pytest.raises(ConduitClientError) as misfit:
        client.wait(work.work.id, data_type=Order)
    assert misfit.value.code == "invalid_result_data"
    assert work.work.id in misfit.value.message

    with pytest.raises(InvalidRequest) as unknown:
        client.submit("nope")
    assert (unknown.value.code, unknown.value.status) == ("unknown_binding", 422)
    with pytest.raises(NotFound) as missing:
        client.get("no-such-work")
    assert missing.value.code == "not_found"
    assert "no-such-work" in missing.value.message
    with pytest.raises(NotFound):
        client.wait("no-such-work", timeout=5)

    # An id makes a resend safe: refused, or with exist_ok the stored Work.
    client.submit("echo", {"n": 1}, id="order-1")
    with pytest.raises(Conflict) as taken:
        client.submit("echo", {"n": 2}, id="order-1")
    assert taken.value.code == "work_exists"
    assert client.submit("echo", {"n": 2}, id="order-1", exist_ok=True).work.id == "order-1"
    assert client.wait("order-1", data_type=Echo).data == Echo(inputs=[Order(n=1)])

    # A Work that does not end: a clear timeout; then cancel it, and wait sees it cancelled.
    held = client.submit("held").work.id
    wait_for("the held job to run", lambda: daemon.runs(held, "start"))
    with pytest.raises(WaitTimeout) as late:
        client.wait(held, timeout=0.3)
    assert late.value.code == "wait_timeout"
    assert held in late.value.message
    assert "running" in late.value.message
    assert client.cancel(held, reason="no longer needed").work.status == "cancelled"
    cancelled = client.wait(held, timeout=30)
    assert (cancelled.status, cancelled.ok, cancelled.data) == ("cancelled", False, None)
    with pytest.raises(Conflict):
        client.cancel(held)

    # Failed with no retries left: wait returns it blocked; retry runs it again.
    gated = client.submit("gated").work.id
    blocked = client.wait(gated, timeout=30)
    assert blocked.status == "ready"
    assert blocked.blocked_reason
    assert not blocked.ok
    (daemon.root / "gate").touch()
    client.retry(gated, reason="gate opened")
    assert client.wait(gated, timeout=30).status == "completed"

    # The human gate: approve runs the Work, refuse cancels it.
    deploy = client.submit("deploy").work.id
    wait_for("the deploy to be held", lambda: client.get(deploy).work.status == "held")
    assert client.approve(deploy, reason="looks fine").action == "approved"
    assert client.wait(deploy, timeout=30).status == "completed"
    second = client.submit("deploy").work.id
    wait_for("the second deploy to be held", lambda: client.get(second).work.status == "held")
    assert client.refuse(second).action == "refused"
    assert client.wait(second, timeout=30).status == "cancelled"
    with pytest.raises(NotFound):
        client.approve("no-such-work")
    client.close()


def test_async_client_bulk_submit_inputs_and_list_paging(
    make_daemon: Callable[..., Daemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = start(make_daemon, tmp_path, monkeypatch, concurrency=64)

    async def main() -> None:
        async with AsyncClient(url(daemon), token=daemon.token) as client:
            items = [SubmitItem(binding="echo", input={"n": i}) for i in range(200)]
            items.insert(50, SubmitItem(binding="nope"))
            batch = await client.submit_many(items)
            assert (batch.created, batch.refused) == (200, 1)
            refused = batch.items[50]
            assert (refused.index, refused.created, refused.code) == (50, False, "unknown_binding")
            ids = batch.ids
            assert len(set(ids)) == 200

            # Many tasks share the client; each result decodes into the caller's type.
            outcomes: dict[int, Any] = {}

            async def wait_one(i: int) -> None:
                outcomes[i] = await client.wait(ids[i], timeout=60, data_type=Echo)

            async with anyio.create_task_group() as tg:
                for i in range(0, 200, 20):
                    tg.start_soon(wait_one, i)
            assert {i: o.data for i, o in outcomes.items()} == {
                i: Echo(inputs=[Order(n=i)]) for i in range(0, 200, 20)
            }
            every = await client.wait_many(ids, timeout=120, data_type=Echo)
            assert [o.data.inputs[0].n for o in every if o.data] == list(range(200))

            # Paging: 50 a page, newest first (ids grow with time), until next is None; the
            # filters apply.
            seen: list[str] = []
            after = None
            while True:
                page = await client.list(binding="echo", status="completed", limit=50, after=after)
                assert len(page.items) <= 50
                seen += [work.id for work in page.items]
                if page.next is None:
                    break
                after = page.next
            assert seen == sorted(ids, reverse=True)
            assert len(seen) == 200
            assert [w.id async for w in client.iter_work(binding="echo", page_size=64)] == seen
            with pytest.raises(InvalidRequest) as bad_limit:
                await client.list(limit=501)
            assert bad_limit.value.code == "invalid_query"

            # Inputs to a standing Work; a delivery id makes a resend idempotent.
            standing = (await client.submit("echo", {"n": 0}, kind="standing")).work.id
            first = await client.inputs(standing, {"n": 1}, delivery_id="d-1")
            again = await client.inputs(standing, {"n": 1}, delivery_id="d-1")
            assert first.work_id == standing
            assert again.id == first.id
            with pytest.raises(NotFound):
                await client.inputs("no-such-work", {})
            with pytest.raises(NotFound) as gone:
                await client.cancel("no-such-work")
            assert gone.value.code == "not_found"

    anyio.run(main)


def test_the_example_script_submits_and_reads_typed_results(
    daemons: list[Daemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def make(**settings: Any) -> Daemon:  # one store is enough: the script only sees the API
        daemons.append(Daemon(tmp_path, str(tmp_path / "conduit.db"), **settings))
        return daemons[-1]

    daemon = start(make, tmp_path, monkeypatch)
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "client_submit_many.py"), "--count", "20",
         "--config", str(daemon.config), "--timeout", "60"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "20 completed, 0 not; sum of n = 190" in done.stdout


def test_sync_client_keeps_its_connection_alive_and_reopens_one_the_daemon_closed(
    make_daemon: Callable[..., Daemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conduit_core.client._sync import _closed_by_peer

    daemon = start(make_daemon, tmp_path, monkeypatch)
    with Client(url(daemon), token=daemon.token) as client:
        client.health()
        (conn,) = client._idle
        assert conn.sock is not None
        local = conn.sock.getsockname()
        client.submit("echo", {"n": 1})
        client.list(limit=1)
        # One connection carried the three calls.
        assert [c.sock.getsockname() for c in client._idle if c.sock is not None] == [local]
        # The daemon closes an idle kept-alive connection after its timeout (uvicorn's 5 s):
        # the next call sees it closed and opens a new one, and is answered.
        wait_for("the idle connection closed", lambda: _closed_by_peer(conn.sock), timeout=30)
        assert client.health()["status"] == "ok"
        (fresh,) = client._idle
        assert fresh is not conn


def test_async_client_keeps_its_connection_alive_and_reopens_one_the_daemon_closed(
    make_daemon: Callable[..., Daemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = start(make_daemon, tmp_path, monkeypatch)

    async def go() -> None:
        async with AsyncClient(url(daemon), token=daemon.token) as client:
            await client.health()
            (conn,) = client._idle
            await client.submit("echo", {"n": 1})
            await client.list(limit=1)
            assert client._idle == [conn]  # one connection carried the three calls
            # Once the daemon has closed it (its keep-alive timeout), the next call opens
            # a new one and is answered.
            with anyio.fail_after(30), pytest.raises(anyio.EndOfStream):
                await conn.reader.receive(1)  # nothing comes but the end
            assert (await client.health())["status"] == "ok"
            (fresh,) = client._idle
            assert fresh is not conn

    anyio.run(go)


def test_clients_list_the_daemons_and_drain_the_one_they_talk_to(
    make_daemon: Callable[..., Daemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = start(make_daemon, tmp_path, monkeypatch)
    held = daemon.submit("held", id="long-job")
    daemon.wait_attempt(held, "running")
    with Client(url(daemon), token=daemon.token) as client:
        listed = client.daemons()
        assert listed.lost_after_ms > 0
        (me,) = listed.daemons
        assert (me.state, me.pid) == ("running", daemon.proc.pid if daemon.proc else -1)
        assert me.last_seen_ms >= me.started_at_ms > 0

        drained = client.drain()
        assert (drained.owner, drained.state, drained.running_attempts) == (
            me.id, "draining", 1
        )
        assert client.drain().state == "draining"  # idempotent

        async def listed_async() -> list[str]:
            async with AsyncClient(url(daemon), token=daemon.token) as aclient:
                return [d.state for d in (await aclient.daemons()).daemons]

        # The daemon writes its registry row's new state on its next pass.
        wait_for("the async client to list the daemon draining",
                 lambda: anyio.run(listed_async) == ["draining"])  # fmt: skip
        assert [d.state for d in client.daemons().daemons] == ["draining"]
    daemon.release(held)
    assert daemon.wait_exit(timeout=30) == 0
    assert daemon.runs(held, "end") == 1
    gone_client = Client(url(daemon), token=daemon.token, timeout=2)
    with gone_client, pytest.raises(DaemonUnavailable) as gone:
        gone_client.drain()
    assert gone.value.code == "daemon_unreachable"
