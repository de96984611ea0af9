"""Work search and bulk actions through a real daemon, on both stores: ``GET /v1/work``'s
filters and keyset pages, ``conduit work list``'s options, ``POST /v1/work/bulk/{action}`` and
``conduit work bulk`` (dry run, cap, per-item results, the actor recorded)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import anyio
import msgspec
import pytest

from conduit_core.client import AsyncClient, Client
from tests.daemon.conftest import Daemon, wait_for


def _list(daemon: Daemon, **params: Any) -> dict[str, Any]:
    status, body = daemon.raw("GET", f"/v1/work?{urlencode(params)}")
    assert status == 200, body
    return body


def _ids(daemon: Daemon, **params: Any) -> list[str]:
    return [w["id"] for w in _list(daemon, **params)["items"]]


def _bulk(daemon: Daemon, action: str, **body: Any) -> tuple[int, dict[str, Any]]:
    return daemon.raw("POST", f"/v1/work/bulk/{action}", msgspec.json.encode(body))


@pytest.fixture
def populated(make_daemon: Callable[..., Daemon]) -> tuple[Daemon, list[str], list[str]]:
    """A daemon with six completed Work (customers acme/globex) and three whose only attempt
    failed with no retry left (``gated``: exhausted)."""
    daemon = make_daemon().start()
    done = []
    for n in range(6):
        customer = "acme" if n % 2 == 0 else "globex"
        done.append(daemon.submit("ok", id=f"order-{n}", input={"customer": customer, "n": n}))
        time.sleep(0.002)  # distinct creation times, so the order is the submit order
    failed = [daemon.submit("gated", id=f"gate-{n}", input={"customer": "initech"})
              for n in range(3)]  # fmt: skip
    for work_id in done:
        daemon.wait_status(work_id, "completed")
    for work_id in failed:
        wait_for(f"{work_id} exhausted", lambda w=work_id: daemon.show(w).work.blocked_reason)
    return daemon, done, failed


def test_search_filters_order_and_keyset_pages(
    populated: tuple[Daemon, list[str], list[str]],
) -> None:
    daemon, done, failed = populated
    everything = _ids(daemon)
    assert everything == [*reversed(failed), *reversed(done)]  # newest first by default
    assert _ids(daemon, order="oldest") == [*done, *failed]
    # Keyset pages: the same rows, each once, whatever the page size.
    paged, after = [], None
    while True:
        page = _list(daemon, limit=2, **({"after": after} if after else {}))
        paged += [w["id"] for w in page["items"]]
        after = page["next"]
        if after is None:
            break
    assert paged == everything
    assert _ids(daemon, id="order-3") == ["order-3"]
    assert _ids(daemon, id_prefix="gate-", order="oldest") == failed
    assert _ids(daemon, binding="ok", limit=3) == ["order-5", "order-4", "order-3"]
    # Exhausted Work is its own state: not in `ready`, shown as `exhausted`.
    exhausted = _list(daemon, status="exhausted", order="oldest")["items"]
    assert [w["id"] for w in exhausted] == failed
    assert {(w["status"], w["state"]) for w in exhausted} == {("ready", "exhausted")}
    assert _ids(daemon, status="ready") == []
    assert _ids(daemon, status="completed", scope="root") == list(reversed(done))
    assert _ids(daemon, **{"input.customer": "acme"}, order="oldest") == done[0::2]
    assert _ids(daemon, **{"input.n": "5"}) == ["order-5"]
    assert _ids(daemon, since="-1h") == everything
    assert _ids(daemon, until="-1h") == []
    iso = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    assert _ids(daemon, until=iso.replace(str(datetime.now(UTC).year), "2000")) == []


@pytest.mark.parametrize(
    ("query", "code", "named"),
    [
        ({"status": "bogus"}, "invalid_status", "'status'"),
        ({"since": "yesterday"}, "invalid_time", "'since'"),
        ({"until": "2026-12-03T12:00:00"}, "invalid_time", "'until'"),  # no offset
        ({"after": "%%%"}, "invalid_cursor", "'after'"),
        ({"order": "random"}, "invalid_filter", "'order'"),
        ({"input.no space": "x"}, "invalid_filter", "'input'"),
        ({"id_prefix": "a/b"}, "invalid_filter", "'id_prefix'"),
        ({"sort": "id"}, "invalid_query", "'sort'"),
    ],
)
def test_a_bad_filter_is_refused_with_a_code_naming_it(
    make_daemon: Callable[..., Daemon], query: dict[str, str], code: str, named: str
) -> None:
    daemon = make_daemon().start()
    status, body = daemon.raw("GET", f"/v1/work?{urlencode(query)}")
    assert status == 400
    assert body["code"] == code
    assert named in body["error"]


def test_cli_list_takes_the_same_filters(populated: tuple[Daemon, list[str], list[str]]) -> None:
    daemon, done, failed = populated
    out = daemon.cli("work", "list", "--status", "exhausted", "--order", "oldest", "--json")
    assert [w["id"] for w in json.loads(out.stdout)["items"]] == failed
    out = daemon.cli("work", "list", "--input", "customer=globex", "--json")
    assert [w["id"] for w in json.loads(out.stdout)["items"]] == list(reversed(done[1::2]))
    out = daemon.cli("work", "list", "--id-prefix", "order-", "--limit", "4")
    assert "order-5" in out.stdout
    assert "order-1" not in out.stdout
    assert "more: --after " in out.stdout
    after = out.stdout.split("more: --after ")[1].split()[0]
    rest = daemon.cli("work", "list", "--id-prefix", "order-", "--limit", "4", "--after", after)
    assert "order-1" in rest.stdout
    assert "order-0" in rest.stdout
    assert "order-5" not in rest.stdout
    table = daemon.cli("work", "list", "--status", "exhausted").stdout
    assert "exhausted" in table
    # `work show` names the same state on its status line.
    assert f"{failed[0]}  exhausted" in daemon.cli("work", "show", failed[0]).stdout
    bad = daemon.cli("work", "list", "--since", "yesterday", check=False)
    assert bad.returncode != 0
    assert "invalid_time" in bad.stderr


def test_the_python_client_searches_with_the_same_filters(
    populated: tuple[Daemon, list[str], list[str]],
) -> None:
    daemon, done, failed = populated
    with Client(config=daemon.config) as client:
        page = client.list(status="exhausted", order="oldest")
        assert [w.id for w in page.items] == failed
        acme = client.list(input={"customer": "acme"}, order="oldest", since="-1h")
        assert [w.id for w in acme.items] == done[0::2]
        assert [w.id for w in client.iter_work(id_prefix="order-", page_size=2)] == list(
            reversed(done)
        )

    async def from_async() -> list[str]:
        async with AsyncClient(config=daemon.config) as client:
            return [w.id async for w in client.iter_work(binding="ok", order="oldest")]

    assert anyio.run(from_async) == done


def test_bulk_retry_dry_run_cap_and_per_item_results(
    populated: tuple[Daemon, list[str], list[str]],
) -> None:
    daemon, done, failed = populated
    status, dry = _bulk(daemon, "retry", filter={"status": "exhausted"}, dry_run=True)
    assert status == 200, dry
    assert dry["matched"] == 3
    assert sorted(dry["ids"]) == sorted(failed)
    assert dry["results"] == []
    assert all(daemon.show(w).work.blocked_reason for w in failed)  # a dry run changes nothing
    status, over = _bulk(daemon, "retry", filter={"status": "exhausted"}, cap=2)
    assert status == 422
    assert over["code"] == "over_cap"
    assert all(daemon.show(w).work.blocked_reason for w in failed)  # refused whole
    (daemon.root / "gate").touch()  # the retried jobs now succeed
    status, done_body = _bulk(daemon, "retry", filter={"status": "exhausted"},
                              reason="gate fixed")  # fmt: skip
    assert status == 200, done_body
    assert done_body["succeeded"] == 3
    assert done_body["failed"] == 0
    assert done_body["actor"] == "default"
    for work_id in failed:
        daemon.wait_status(work_id, "completed")
        history = daemon.raw("GET", f"/v1/work/{work_id}/history")[1]["items"]
        retries = [e for e in history if e["reason"] == "gate fixed"]
        assert retries
        assert retries[0]["actor"] == "default"
    # Per item: one unknown id and one completed Work fail alone, each with its code.
    status, mixed = _bulk(daemon, "cancel", ids=["nope", done[0]], reason="cleanup")
    assert status == 200
    codes = {r["id"]: r["code"] for r in mixed["results"]}
    assert codes == {"nope": "not_found", done[0]: "not_eligible"}
    assert mixed["failed"] == 2


def test_bulk_refuses_a_request_without_exactly_one_target(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon().start()
    for body in ({}, {"filter": {"status": "ready"}, "ids": ["a"]}):
        status, answer = _bulk(daemon, "cancel", **body)
        assert status == 400
        assert answer["code"] == "invalid_bulk"
    status, answer = _bulk(daemon, "cancel", filter={"status": "nope"})
    assert status == 400
    assert answer["code"] == "invalid_status"
    status, answer = daemon.raw("POST", "/v1/work/bulk/explode", b"{}")
    assert status in (404, 405)


def test_cli_bulk_cancel_by_filter_and_ids(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    ids = [daemon.submit("forever", id=f"long-{n}", input={"team": "a"}) for n in range(3)]
    for work_id in ids:
        daemon.wait_status(work_id, "running")
    dry = daemon.cli("work", "bulk", "cancel", "--input", "team=a", "--dry-run")
    assert dry.stdout.startswith("3 Work would be cancelled")
    assert all(str(daemon.show(w).work.status) == "running" for w in ids)
    none = daemon.cli("work", "bulk", "cancel", "--reason", "x", check=False)
    assert none.returncode != 0
    assert "invalid_bulk" in none.stderr
    one = daemon.cli("work", "bulk", "cancel", "--ids", ids[0], "--reason", "one")
    assert f"{ids[0]}  cancelled" in one.stdout
    rest = daemon.cli("work", "bulk", "cancel", "--input", "team=a", "--reason", "all", "--json",
                      check=False)  # fmt: skip
    result = json.loads(rest.stdout)
    assert rest.returncode == 1  # ids[0] was cancelled already: that item fails alone
    assert {r["id"]: r["ok"] for r in result["results"]} == {
        ids[0]: False, ids[1]: True, ids[2]: True,
    }
    for work_id in ids:
        assert daemon.show(work_id).work.cancelled_by == "default"
