"""Named tokens with roles through a real daemon, on SQLite and PostgreSQL.

A viewer reads but every action answers 403 ``forbidden_role`` and changes nothing; an operator
acts, and what each action writes carries the token's name as ``actor`` (never the token); only
an admin confirms stops and creates or deletes schedules; the daemon's own token file stays an
admin. Wrong tokens from one address are throttled with 429 and ``Retry-After``.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from conduit_core.storage import open_store
from tests.daemon.conftest import Daemon, wait_for

DEPLOY = """
[bindings.deploy]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}' }}

[bindings.failing]
executor = "shell"
retry_delays_seconds = [300]
config = {{ command = 'exit 3' }}
"""

#: A viewer, an operator and an admin, their files in ``{root}`` (see :func:`write_tokens`).
TOKEN_CONFIG = """
[[tokens]]
name = "watcher"
role = "viewer"
file = "{root}/viewer.token"

[[tokens]]
name = "ops"
role = "operator"
file = "{root}/operator.token"

[[tokens]]
name = "root"
role = "admin"
file = "{root}/admin.token"
"""

TOKENS = {"watcher": "viewer-secret-1", "ops": "operator-secret-2", "root": "admin-secret-3"}
FILES = {"watcher": "viewer.token", "ops": "operator.token", "root": "admin.token"}


def write_tokens(root: Path) -> None:
    for name, secret in TOKENS.items():
        path = root / FILES[name]
        path.write_text(secret + "\n")
        os.chmod(path, 0o600)


def post(daemon: Daemon, path: str, body: dict[str, Any], who: str) -> tuple[int, dict[str, Any]]:
    return daemon.raw("POST", path, json.dumps(body).encode(), token=TOKENS[who])


def events(store: str, work_id: str) -> list[Any]:
    async def read() -> list[Any]:
        opened = await open_store(store)
        try:
            return await opened.work_events(work_id)
        finally:
            await opened.aclose()

    return anyio.run(read)


def control_rows(store: str) -> list[dict[str, Any]]:
    if "://" in store:
        import psycopg

        with psycopg.connect(store) as conn:
            rows = conn.execute("SELECT data FROM conduit_control").fetchall()
    else:
        conn = sqlite3.connect(store)
        rows = conn.execute("SELECT data FROM conduit_control").fetchall()
        conn.close()
    return [json.loads(row[0]) for row in rows]


def test_roles_refuse_and_actions_record_the_token_name(
    make_daemon: Callable[..., Daemon], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = tmp_path / "human.toml"
    rules.write_text('[[rules]]\nbindings = ["deploy"]\nreason = "deploys need a person"\n')
    monkeypatch.setenv("CONDUIT_HUMAN_GATE_CONFIG", str(rules))
    write_tokens(tmp_path)
    extra = DEPLOY.format(side=tmp_path / "side.log") + TOKEN_CONFIG.format(root=tmp_path)
    daemon = make_daemon(extra=extra).start()

    # The operator submits; the gate holds it.
    status, made = post(daemon, "/v1/work", {"binding": "deploy"}, "ops")
    assert status == 201, made
    deploy = made["work"]["id"]
    daemon.wait_status(deploy, "held")

    # The viewer reads everything and may do nothing: each action is 403 and changes nothing.
    assert daemon.raw("GET", f"/v1/work/{deploy}", token=TOKENS["watcher"])[0] == 200
    assert daemon.raw("GET", "/v1/needs-you", token=TOKENS["watcher"])[0] == 200
    assert daemon.raw("GET", "/v1/schedules", token=TOKENS["watcher"])[0] == 200
    refused = [
        ("POST", "/v1/work", {"binding": "deploy"}),
        ("POST", "/v1/work/batch", {"items": [{"binding": "deploy"}]}),
        *(("POST", f"/v1/work/{deploy}/{action}", {})
          for action in ("approve", "release", "cancel", "retry", "interrupt")),
        ("POST", f"/v1/work/{deploy}/refuse", {"reason": "no"}),
        ("POST", f"/v1/work/{deploy}/input", {"payload": 1}),
        ("POST", f"/v1/work/{deploy}/inject", {"payload": 1}),
        ("POST", f"/v1/work/{deploy}/confirm-stopped", {"epoch": 1}),
        ("POST", "/v1/schedules", {"spec": "0 * * * *", "target": {"binding": "deploy"}}),
        ("PATCH", "/v1/schedules/some", {"action": "pause"}),
        ("DELETE", "/v1/schedules/some", None),
        ("POST", "/v1/schedules/some/run", None),
    ]  # fmt: skip
    for method, path, body in refused:
        raw = json.dumps(body).encode() if body is not None else None
        status, answer = daemon.raw(method, path, raw, token=TOKENS["watcher"])
        assert (status, answer.get("code")) == (403, "forbidden_role"), (method, path, answer)
        assert "'watcher' has role 'viewer'" in answer["error"]
    assert daemon.show(deploy).work.status == "held"
    assert len(daemon.api().request("GET", "/v1/work", None, dict)["items"]) == 1

    # The operator may not confirm stops nor create, edit or delete schedules (an admin's).
    for method, path, body in [
        ("POST", f"/v1/work/{deploy}/confirm-stopped", {"epoch": 1}),
        ("POST", "/v1/schedules", {"spec": "0 * * * *", "target": {"binding": "deploy"}}),
        ("PATCH", "/v1/schedules/some", {"action": "edit", "spec": "0 * * * *"}),
        ("DELETE", "/v1/schedules/some", None),
    ]:
        raw = json.dumps(body).encode() if body is not None else None
        status, answer = daemon.raw(method, path, raw, token=TOKENS["ops"])
        assert (status, answer.get("code")) == (403, "forbidden_role"), (method, path, answer)
    # ...which the admin, and the daemon's own token (an admin), get past the role check.
    for token in (TOKENS["root"], daemon.token):
        status, answer = daemon.raw("POST", f"/v1/work/{deploy}/confirm-stopped",
                                    b'{"epoch": 1}', token=token)  # fmt: skip
        assert answer.get("code") == "not_held", answer

    # Each action records who: approve (operator), and the answer says so.
    status, settled = post(daemon, f"/v1/work/{deploy}/approve", {"reason": "ok"}, "ops")
    assert (status, settled["actor"]) == (200, "ops"), settled
    daemon.wait_status(deploy, "completed")

    # A refusal by the admin cancels, and the Work says by whom.
    status, made = post(daemon, "/v1/work", {"binding": "deploy"}, "ops")
    refused_id = made["work"]["id"]
    daemon.wait_status(refused_id, "held")
    status, settled = post(daemon, f"/v1/work/{refused_id}/refuse", {"reason": "no"}, "root")
    assert (status, settled["actor"]) == (200, "root"), settled
    assert daemon.show(refused_id).work.cancelled_by == "root"

    # Input, manual retry and cancel of a failing Work, each by the operator.
    status, made = post(daemon, "/v1/work", {"binding": "failing"}, "ops")
    failing = made["work"]["id"]
    wait_for("the failure", lambda: daemon.show(failing).work.failure_count >= 1 or None)
    status, sent = post(daemon, f"/v1/work/{failing}/input", {"payload": {"n": 1}}, "ops")
    assert (status, sent["actor"]) == (202, "ops"), sent
    status, _ = post(daemon, f"/v1/work/{failing}/retry", {"reason": "again"}, "ops")
    assert status == 200
    status, cancelled = post(daemon, f"/v1/work/{failing}/cancel", {"reason": "enough"}, "ops")
    assert (status, cancelled["work"]["cancelled_by"]) == (200, "ops"), cancelled

    # An interrupt's control intent carries the operator's name.
    status, made = post(daemon, "/v1/work", {"binding": "forever"}, "ops")
    forever = made["work"]["id"]
    daemon.wait_attempt(forever, "running")
    assert post(daemon, f"/v1/work/{forever}/interrupt", {}, "ops")[0] == 202
    daemon.wait_status(forever, "ready")
    post(daemon, f"/v1/work/{forever}/cancel", {}, "ops")

    # Schedules: the admin creates one, the operator pauses it; the record says who.
    status, made = post(daemon, "/v1/schedules", {"id": "nightly", "spec": "0 3 * * *",
                        "target": {"binding": "deploy"}}, "root")  # fmt: skip
    assert status == 201, made
    status, paused = daemon.raw("PATCH", "/v1/schedules/conduit:nightly",
                                b'{"action": "pause"}', token=TOKENS["ops"])  # fmt: skip
    assert (status, paused["status"], paused["changed_by"]) == (200, "paused", "ops"), paused

    # What the store wrote: the names, never a token.
    by_type = {e.type: e for e in events(daemon.store, deploy)}
    assert by_type["core.gate.released"].actor == "ops"
    assert by_type["core.input"].actor == "ops"
    assert {e.type: e for e in events(daemon.store, refused_id)}["core.gate.refused"].actor == "root"
    failing_events = events(daemon.store, failing)
    assert {e.actor for e in failing_events if e.type in ("core.input", "core.manual.retry")} == {
        "ops"
    }
    interrupts = [c for c in control_rows(daemon.store) if c["work_id"] == forever]
    assert [c["actor"] for c in interrupts] == ["ops"]
    log = daemon.log()
    for secret in TOKENS.values():
        assert secret not in log


def test_wrong_tokens_are_throttled_per_address_with_retry_after(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    # The throttle lives in the daemon's memory: one store is enough.
    daemon = Daemon(tmp_path, str(tmp_path / "conduit.db"))
    daemons.append(daemon)
    daemon.start()
    codes = [daemon.raw("GET", "/v1/health", token=f"guess-{n}")[0] for n in range(10)]
    assert codes == [401] * 10
    # The 11th try is refused before its token is compared, even the right one.
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
    conn.request("GET", "/v1/health", headers={"Authorization": f"Bearer {daemon.token}"})
    reply = conn.getresponse()
    body = json.loads(reply.read())
    conn.close()
    assert reply.status == 429, body
    assert body["code"] == "login_throttled"
    assert 1 <= int(reply.getheader("Retry-After") or 0) <= 30
    # The console's login and /metrics share the throttle.
    assert daemon.raw("GET", "/metrics")[0] == 429
    log = daemon.log()
    assert "wrong bearer token from 127.0.0.1" in log
    assert "guess-" not in log
    assert daemon.token not in log
