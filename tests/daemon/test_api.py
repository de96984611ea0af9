"""The HTTP API's refusals (401, 400 naming the field, 404, 422), the OpenAPI document, and the
daemon's start-up refusals (incompatible schema, network filesystem, a second daemon)."""

from __future__ import annotations

import json
import signal
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from openapi_spec_validator import validate

from conduit_core.daemon import check_local_filesystem, filesystem_type
from conduit_core.errors import StoreError
from conduit_core.http import ApiClient, Health
from tests.daemon.conftest import Daemon, wait_for


@pytest.fixture
def store(tmp_path: Path) -> str:
    """These cases do not depend on the backend: SQLite only."""
    return str(tmp_path / "conduit.db")


def test_requests_without_the_token_change_nothing(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    body = b'{"binding": "ok"}'
    for token in (None, "wrong-token"):
        status, error = daemon.raw("POST", "/v1/work", body, token=token)
        assert (status, error["code"]) == (401, "unauthorized")
        status, _ = daemon.raw("GET", "/v1/work", token=token)
        assert status == 401
    status, page = daemon.raw("GET", "/v1/work")
    assert (status, page["items"]) == (200, [])
    assert (daemon.data / "token").stat().st_mode & 0o777 == 0o600


def test_bad_bodies_are_refused_naming_the_field(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    cases = [
        (b'{"binding": "ok",', 400, "invalid_json", "malformed JSON"),
        (b'{"binding": "ok", "bogus": 1}', 400, "invalid_body", "bogus"),
        (b'{"binding": 7}', 400, "invalid_body", "$.binding"),
        (b'{"binding": "ok", "kind": "nope"}', 400, "invalid_body", "$.kind"),
        (b'{"binding": "missing"}', 422, "unknown_binding", "missing"),
        (b'{"binding": "ok", "scope": "nowhere"}', 422, "unknown_scope", "nowhere"),
    ]
    for body, status, code, named in cases:
        got, error = daemon.raw("POST", "/v1/work", body)
        assert (got, error["code"]) == (status, code), body
        assert named in error["error"], error
    assert daemon.raw("GET", "/v1/work")[1]["items"] == []

    assert daemon.raw("GET", "/v1/work/nope")[0] == 404
    assert daemon.raw("POST", "/v1/work/nope/retry", b"{}")[0] == 404
    assert daemon.raw("GET", "/v1/work?status=bogus")[0] == 400
    work_id = daemon.submit("ok", id="fixed-id")
    status, error = daemon.raw("POST", "/v1/work", b'{"binding": "ok", "id": "fixed-id"}')
    assert (status, error["code"]) == (409, "work_exists")
    assert daemon.raw("POST", f"/v1/work/{work_id}/input", b'{"payload": 1, "x": 2}')[0] == 400


def test_openapi_document_validates(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    status, document = daemon.raw("GET", "/v1/openapi.json")
    assert status == 200
    validate(document)
    assert {"/v1/work", "/v1/work/{id}", "/v1/capacity", "/v1/health"} <= set(document["paths"])
    submit = document["components"]["schemas"]["SubmitRequest"]
    assert submit["additionalProperties"] is False
    assert daemon.raw("GET", "/v1/openapi.json", token=None)[0] == 401


def test_capacity_health_and_doctor(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    status, health = daemon.raw("GET", "/v1/health")
    assert (status, health["status"]) == (200, "ok")
    status, capacity = daemon.raw("GET", "/v1/capacity")
    assert {p["name"] for p in capacity["pools"]} >= {"global", "jobs"}
    assert capacity["scopes"] == [{"name": "team", "limit": 2, "in_use": 0, "waiting": 0}]
    doctor = daemon.cli("doctor")
    assert "ok   store" in doctor.stdout
    assert "fail" not in doctor.stdout


def test_unix_socket_and_json_logs(make_daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    sock = tmp_path / "api.sock"
    daemon = make_daemon(settings_extra=f'http.unix_socket = "{sock}"')
    daemon.proc = None
    log = daemon.log_path.open("ab")
    daemon.proc = subprocess.Popen(
        [sys.executable, "-m", "conduit_core.cli", "daemon", "--config", str(daemon.config),
         "--log-format", "json", "--rescan", "0.2"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    log.close()
    wait_for("the daemon", daemon._healthy)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    client = ApiClient(daemon.token, unix_socket=str(sock))
    health = client.request("GET", "/v1/health", None, Health)
    assert health.status == "ok"
    work_id = daemon.submit("ok")
    daemon.wait_status(work_id, "completed")
    events = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
    ended = [e for e in events if e["message"].startswith("attempt ended")]
    assert ended[0]["execution_id"] == f"{work_id}#1"
    assert ended[0]["epoch"] == 1
    daemon.signal(signal.SIGTERM)
    assert daemon.wait_exit() == 0
    assert not sock.exists()


def test_work_list_and_show_without_a_daemon(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon()
    submitted = daemon.cli("work", "submit", "echo", "--id", "direct-1").stdout
    assert "direct-1" in submitted
    assert "direct-1" in daemon.cli("work", "list").stdout
    assert "ready" in daemon.cli("work", "show", "direct-1").stdout
    daemon.start()  # a daemon started later runs it
    assert daemon.wait_status("direct-1", "completed").work.status == "completed"


def test_newer_schema_is_refused(make_daemon: Callable[..., Daemon], store: str) -> None:
    daemon = make_daemon().start()
    daemon.signal(15)
    assert daemon.wait_exit() == 0
    with sqlite3.connect(store) as conn:
        conn.execute("UPDATE conduit_meta SET value = '999' WHERE key = 'schema_version'")
    daemon.start(wait=False)
    assert daemon.wait_exit() == 1
    assert "error [store_schema_newer]" in daemon.log()


def test_a_second_daemon_on_the_same_data_dir_is_refused(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon().start()
    second = make_daemon()
    second.config.write_text(daemon.config.read_text().replace(str(daemon.port), "1"))
    second.start(wait=False)
    assert second.wait_exit() == 1
    assert "error [daemon_running]" in second.log()


MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
server:/export /mnt/shared nfs4 rw,relatime 0 0
//host/share /mnt/smb cifs rw 0 0
me@host:/x /mnt/ssh fuse.sshfs rw 0 0
tmpfs /mnt/shared/local tmpfs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/mnt/shared/conduit.db", "nfs4"),
        ("/mnt/smb/db/conduit.db", "cifs"),
        ("/mnt/ssh/conduit.db", "fuse.sshfs"),
        ("/mnt/shared/local/conduit.db", "tmpfs"),
        ("/home/me/conduit.db", "ext4"),
    ],
)
def test_sqlite_on_a_network_filesystem_is_refused(path: str, fstype: str) -> None:
    assert filesystem_type(Path(path).parent, MOUNTS) == fstype
    if fstype in ("tmpfs", "ext4"):
        check_local_filesystem(Path(path), MOUNTS)
        return
    with pytest.raises(StoreError, match=f"network filesystem \\({fstype}\\)") as info:
        check_local_filesystem(Path(path), MOUNTS)
    assert info.value.code == "store_on_network_fs"
