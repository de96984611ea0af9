"""The HTTP boundary's limits on a real daemon (SQLite): the token before anything else, the body
size limit (declared and streamed), nesting depth, the id grammar, page sizes, ``/v1/schedules``
bodies, 405's ``Allow``, and the OpenAPI document covering every route served."""

from __future__ import annotations

import http.client
import json
import logging
import select
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from starlette.routing import Route

from conduit_core.config import Settings, parse_config
from conduit_core.daemon._logging import TextFormatter, configure_logging
from conduit_core.http import create_app
from conduit_core.http.routes_schedules import mount_schedules
from conduit_core.validation import MAX_BODY_BYTES
from tests.daemon.conftest import Daemon

MIB = 1024 * 1024


@pytest.fixture
def store(tmp_path: Path) -> str:
    """The boundary does not depend on the backend: SQLite only."""
    return str(tmp_path / "conduit.db")


def request(
    daemon: Daemon,
    method: str,
    path: str,
    body: bytes | None = None,
    *,
    token: str | None = "default",
    headers: dict[str, str] | None = None,
) -> tuple[int, http.client.HTTPMessage, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=20)
    sent = {"Content-Type": "application/json"} | (headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {daemon.token if token == 'default' else token}"
    conn.request(method, path, body=body, headers=sent)
    reply = conn.getresponse()
    data = reply.read()
    conn.close()
    return reply.status, reply.headers, msgspec.json.decode(data) if data else None


def stored_work(daemon: Daemon) -> list[str]:
    status, _, page = request(daemon, "GET", "/v1/work?limit=500")
    assert status == 200
    return [item["id"] for item in page["items"]]


def test_every_request_needs_the_token_before_routing(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    probes = [
        ("GET", "/nowhere"),
        ("GET", "/v1/nowhere"),
        ("DELETE", "/v1/work"),
        ("PUT", "/v1/schedules/x"),
        ("GET", "/v1/openapi.json"),
    ]
    for method, path in probes:
        for token in (None, "wrong-token"):
            status, _, error = request(daemon, method, path, token=token)
            assert (status, error["code"]) == (401, "unauthorized"), (method, path, token)
    # With the token the same requests reach routing: 404, and 405 naming what is allowed.
    assert request(daemon, "GET", "/nowhere")[0] == 404
    status, headers, error = request(daemon, "DELETE", "/v1/work")
    assert (status, error["code"]) == (405, "method_not_allowed")
    assert headers["Allow"] == "GET, HEAD, POST"
    status, headers, _ = request(daemon, "PUT", "/v1/schedules/x")
    assert (status, headers["Allow"]) == (405, "DELETE, PATCH")
    status, headers, _ = request(daemon, "GET", "/v1/work/x/cancel")
    assert (status, headers["Allow"]) == (405, "POST")


def test_a_declared_oversized_body_is_refused_unread(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    # 300 MB announced, a few bytes sent: the answer comes from the header alone.
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=20) as sock:
        sock.sendall(
            b"POST /v1/work HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {daemon.token}\r\n".encode()
            + b"Content-Length: 300000000\r\n\r\n"
            + b'{"binding": "ok", "input": "'
        )
        status, body = read_response(sock)
    assert status == 413
    assert body["code"] == "too_large"
    assert "settings.http.max_body_bytes" in body["error"]
    # Over the 2 MiB default: refused; a 900 KiB input: accepted (the positive control).
    assert MAX_BODY_BYTES == 2 * MIB == Settings().http.max_body_bytes
    over = b'{"binding": "ok", "input": "' + b"x" * (2 * MIB) + b'"}'
    status, _, error = request(daemon, "POST", "/v1/work", over)
    assert (status, error["code"]) == (413, "too_large")
    assert stored_work(daemon) == []
    under = b'{"binding": "ok", "input": "' + b"x" * (900 * 1024) + b'"}'
    status, _, created = request(daemon, "POST", "/v1/work", under)
    assert status == 201, created
    assert stored_work(daemon) == [created["work"]["id"]]


def test_a_streamed_oversized_body_is_cut_off_while_reading(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon(settings_extra="http.max_body_bytes = 65536").start()
    assert daemon.proc is not None
    rss_before = psutil.Process(daemon.proc.pid).memory_info().rss
    chunk = b"x" * 65536
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=20) as sock:
        sock.sendall(
            b"POST /v1/work HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {daemon.token}\r\n".encode()
            + b"Transfer-Encoding: chunked\r\n\r\n"
            + b'5\r\n{"a":\r\n'
        )
        # Offer up to 300 MB, one chunk at a time, stopping as soon as the daemon answers.
        deadline = time.monotonic() + 60
        while sent < 300 * MIB and time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                # Refused and closed, or no longer read: either way the answer is waiting.
                break
            sent += len(chunk)
        status, body = read_response(sock)
    assert (status, body["code"]) == (413, "too_large")
    # The daemon stopped reading near the limit: what got through is socket buffers, not 300 MB.
    assert sent < 32 * MIB, sent
    rss_after = psutil.Process(daemon.proc.pid).memory_info().rss
    assert rss_after - rss_before < 32 * MIB
    assert stored_work(daemon) == []
    # The same daemon still serves a body just under its limit.
    fits = b'{"binding": "ok", "input": "' + b"x" * 65000 + b'"}'
    status, _, _ = request(daemon, "POST", "/v1/work", fits)
    assert status == 201


def read_response(sock: socket.socket) -> tuple[int, Any]:
    """One HTTP/1.1 response with a Content-Length body, read from a raw socket."""
    sock.settimeout(20)
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        assert more, f"connection closed before a response: {data!r}"
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    length = next(
        int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length")
    )
    while len(rest) < length:
        more = sock.recv(65536)
        assert more
        rest += more
    return status, msgspec.json.decode(rest[:length])


def test_deep_nesting_is_a_coded_refusal(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    deep = b"[" * 1000 + b"]" * 1000
    # 65 levels decode, but are over the one depth limit (64): stored, they could not be read back.
    shallow_but_over = b"[" * 65 + b"]" * 65
    cases = [
        ("/v1/work", b'{"binding": "ok", "input": ' + shallow_but_over + b"}"),
        ("/v1/work", b'{"binding": "ok", "input": ' + deep + b"}"),
        ("/v1/schedules", b'{"spec": "0 * * * *", "extra": {"x": ' + deep + b"}}"),
        ("/v1/work", b'{"binding": "ok", "input": ' + b"[" * 100_000),
        ("/v1/work", b'{"binding": "ok", "input": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001),
    ]
    for path, body in cases:
        status, _, error = request(daemon, "POST", path, body)
        assert (status, error["code"]) == (400, "too_deep"), path
        assert "Traceback" not in error["error"]
    work_id = daemon.submit("ok", input=json.loads("[" * 63 + "]" * 63))  # the control: 64 fit
    status, _, error = request(
        daemon, "POST", f"/v1/work/{work_id}/input", b'{"payload": ' + deep + b"}"
    )
    assert (status, error["code"]) == (400, "too_deep")
    assert stored_work(daemon) == [work_id]
    assert "Traceback" not in daemon.log()


def test_ids_with_a_trailing_newline_are_refused(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    for field in ("id", "scope"):
        body = msgspec.json.encode({"binding": "ok", field: "fine\n"})
        status, _, error = request(daemon, "POST", "/v1/work", body)
        assert status in (400, 422), (field, error)
    status, _, error = request(daemon, "POST", "/v1/work", b'{"binding": "ok", "id": "abc\\n"}')
    assert (status, error["code"]) == (400, "invalid_body")
    assert "$.id" in error["error"]
    status, _, error = request(daemon, "POST", "/v1/work", b'{"binding": "ok", "id": "abc"}')
    assert status == 201  # the same id without the newline: the positive control
    status, _, error = request(
        daemon, "POST", "/v1/work/abc/input", b'{"type": "core.input\\nFORGED", "payload": 1}'
    )
    assert (status, error["code"]) == (400, "invalid_body")
    assert stored_work(daemon) == ["abc"]


def test_text_log_lines_cannot_be_forged() -> None:
    """User text carrying a newline (or any control character) stays on its own line."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Collect()
    handler.setFormatter(TextFormatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("conduit.test-forgery")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("attempt ended work=%s", "w1\n2026-01-01 ERROR conduit: forged\r\x1b[2J")
        logger.warning("work=%s", "caf\u00e9 \u00e0 \u00fc")  # printable: kept as it is
        logger.warning("work=%s", "a\x85b\x7f")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("failed work=%s", "a\u2028b")
    finally:
        logger.removeHandler(handler)
    assert records[0] == (
        "WARNING conduit.test-forgery: attempt ended work="
        "w1\\n2026-01-01 ERROR conduit: forged\\r\\x1b[2J"
    )
    assert records[1] == "WARNING conduit.test-forgery: work=caf\u00e9 \u00e0 \u00fc"
    assert records[2] == "WARNING conduit.test-forgery: work=a\\u0085b\\x7f"
    first, *trace = records[3].split("\n")
    assert first == "ERROR conduit.test-forgery: failed work=a\\u2028b"
    assert trace[0] == "Traceback (most recent call last):"  # a traceback keeps its lines
    # The daemon's text format is this formatter.
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    record_fields = ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing")
    saved_fields = {name: getattr(logging, name) for name in record_fields}
    try:
        configure_logging("text")
        assert isinstance(root.handlers[0].formatter, TextFormatter)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for name, value in saved_fields.items():
            setattr(logging, name, value)
    # The negative control: the stdlib formatter would have let the forged line through.
    plain = logging.Formatter("%(message)s").format(
        logging.makeLogRecord({"msg": "x=%s", "args": ("a\nb",)})
    )
    assert plain.count("\n") == 1


def test_page_limits_outside_1_to_500_are_refused(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    for bad in ("0", "501", "-1", "1e3", "abc", ""):
        status, _, error = request(daemon, "GET", f"/v1/work?limit={bad}")
        assert (status, error["code"]) == (400, "invalid_query"), bad
        assert "1 to 500" in error["error"]
    for good in ("1", "500"):
        assert request(daemon, "GET", f"/v1/work?limit={good}")[0] == 200
    routine = b'{"spec": "0 * * * *", "id": "hourly", "target": {"binding": "ok"}}'
    assert request(daemon, "POST", "/v1/schedules", routine)[0] == 201
    assert request(daemon, "GET", "/v1/schedules/hourly/history?limit=50")[0] == 200
    for bad in ("0", "501"):
        status, _, error = request(daemon, "GET", f"/v1/schedules/hourly/history?limit={bad}")
        assert (status, error["code"]) == (400, "invalid_query"), bad


def test_schedule_bodies_are_validated(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    cases = [
        (b'{"spec": "0 * * * *", "bogus": 1}', "bogus"),
        (b'{"spec": "0 * * * *", "grace_seconds": -5}', "$.grace_seconds"),
        (b'{"spec": "0 * * * *", "grace_seconds": 1e400}', "$.grace_seconds"),
        (b'{"spec": "0 * * * *", "id": "a/../b"}', "$.id"),
        (b'{"spec": "0 * * * *", "id": "nightly\\n"}', "$.id"),
        (b'{"spec": ""}', "$.spec"),
        (b'{"spec": "0 * * * *", "target": {"binding": "ok", "bogus": 1}}', "bogus"),
        (b'{"spec": "0 * * * *", "target": {"work_id": "w\\n"}}', "$.target.work_id"),
        (b'{"spec": "0 * * * *", "target": {"binding": "../x"}}', "$.target.binding"),
    ]
    for body, named in cases:
        status, _, error = request(daemon, "POST", "/v1/schedules", body)
        assert (status, error["code"]) == (400, "invalid_body"), body
        assert named in error["error"], error
    assert conduit_records(daemon) == []
    created = b'{"spec": "0 * * * *", "id": "hourly", "target": {"binding": "ok"}}'
    assert request(daemon, "POST", "/v1/schedules", created)[0] == 201
    status, _, error = request(
        daemon, "PATCH", "/v1/schedules/hourly", b'{"action": "pause", "x": 1}'
    )
    assert (status, error["code"]) == (400, "invalid_body")
    assert [r["status"] for r in conduit_records(daemon)] == ["idle"]


def conduit_records(daemon: Daemon) -> list[dict[str, Any]]:
    """The conduit Routines of ``GET /v1/schedules`` (the host's own crontab may add others)."""
    status, _, merged = request(daemon, "GET", "/v1/schedules")
    assert status == 200
    return [r for r in merged["records"] if r["source"] == "conduit"]


def test_the_document_describes_every_route_served(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon().start()
    status, _, document = request(daemon, "GET", "/v1/openapi.json")
    assert status == 200
    assert document["servers"] == [{"url": "/"}]
    documented = {
        (path, method.upper()) for path, ops in document["paths"].items() for method in ops
    }
    # The routes the daemon's app serves, built the way the daemon builds it.
    config = parse_config(b'[settings]\nstore = "x.db"\n')
    app = mount_schedules(create_app(_Service(config), "t"), lambda: None, "t")  # type: ignore[arg-type]
    served = {
        (route.path, method)
        for route in app.router.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    assert served == documented
    submit = document["paths"]["/v1/work"]["post"]["requestBody"]
    assert submit["required"] is True
    assert document["paths"]["/v1/work/{id}/cancel"]["post"]["requestBody"]["required"] is False
    limit = next(
        p for p in document["paths"]["/v1/work"]["get"]["parameters"] if p["name"] == "limit"
    )
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 500)
    create = document["components"]["schemas"]["ScheduleCreateBody"]
    assert create["additionalProperties"] is False
    assert create["properties"]["grace_seconds"]["minimum"] == 0


class _Service:
    """Enough of an ApiService to build the app (no request is served)."""

    def __init__(self, config: Any) -> None:
        self.config = config
