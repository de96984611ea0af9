"""A small client of the daemon's API (stdlib ``http.client``; TCP or a unix socket).

Its async methods mirror :class:`ApiService`, so the CLI talks to either the same way.
"""

from __future__ import annotations

import http.client
import socket
from typing import Any, TypeVar
from urllib.parse import urlencode

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.http._bulk import BulkRequest, BulkResult
from conduit_core.http._daemons import DaemonList, DrainView
from conduit_core.http._history import HistoryPage
from conduit_core.http._output import OutputTail
from conduit_core.http._schemas import (
    BatchSubmitRequest,
    BatchSubmitResult,
    CancelRequest,
    CapacityView,
    ConfirmStoppedRequest,
    ErrorBody,
    EventView,
    Health,
    InputRequest,
    InterruptRequest,
    RetryRequest,
    SubmitRequest,
    WorkDetail,
    WorkPage,
)
from conduit_core.http._search import WorkFilter

__all__ = ["ApiClient", "split_listen"]

T = TypeVar("T")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:8765`` for IPv6) → (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ConduitError(
            f"settings.http.listen {listen!r} must be host:port", code="invalid_config"
        )
    return host.strip("[]") or "127.0.0.1", int(port)


class ApiClient:
    """``ApiClient(token, listen="127.0.0.1:8765")`` or ``ApiClient(token, unix_socket=path)``."""

    def __init__(
        self,
        token: str,
        *,
        listen: str = "127.0.0.1:8765",
        unix_socket: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._token = token
        self._listen = listen
        self._unix_socket = unix_socket
        self._timeout = timeout

    @property
    def where(self) -> str:
        return f"unix:{self._unix_socket}" if self._unix_socket else f"http://{self._listen}"

    def _connection(self) -> http.client.HTTPConnection:
        if self._unix_socket:
            return _UnixConnection(self._unix_socket, self._timeout)
        host, port = split_listen(self._listen)
        return http.client.HTTPConnection(host, port, timeout=self._timeout)

    def request(self, method: str, path: str, body: msgspec.Struct | None, response: type[T]) -> T:
        conn = self._connection()
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        payload = None
        if body is not None:
            payload = msgspec.json.encode(body)
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=payload, headers=headers)
            reply = conn.getresponse()
            raw = reply.read()
        except OSError as exc:
            raise ConduitError(
                f"the daemon at {self.where} is not reachable ({exc.strerror or exc}); "
                "is `conduit daemon` running?",
                code="daemon_unreachable",
            ) from exc
        finally:
            conn.close()
        if reply.status >= 400:
            try:
                error = msgspec.json.decode(raw, type=ErrorBody)
            except msgspec.DecodeError:
                raise ConduitError(
                    f"the daemon answered {reply.status}", code="daemon_error"
                ) from None
            raise ConduitError(error.error, code=error.code)
        return msgspec.json.decode(raw, type=response)

    # --- the ApiService surface ------------------------------------------------------------

    async def submit(self, req: SubmitRequest) -> WorkDetail:
        return self.request("POST", "/v1/work", req, WorkDetail)

    async def submit_batch(self, req: BatchSubmitRequest) -> BatchSubmitResult:
        """``POST /v1/work/batch``: each item created or refused on its own (see docs/http.md)."""
        return self.request("POST", "/v1/work/batch", req, BatchSubmitResult)

    async def list_work(
        self, filters: WorkFilter | None = None, *, limit: int = 100, after: str | None = None
    ) -> WorkPage:
        query: dict[str, Any] = {**(filters or WorkFilter()).to_query(), "limit": limit}
        if after is not None:
            query["after"] = after
        return self.request("GET", f"/v1/work?{urlencode(query)}", None, WorkPage)

    async def bulk(self, action: str, req: BulkRequest) -> BulkResult:
        """``POST /v1/work/bulk/{action}``: each Work acted on alone (see docs/http.md)."""
        return self.request("POST", f"/v1/work/bulk/{action}", req, BulkResult)

    async def show(self, work_id: str) -> WorkDetail:
        return self.request("GET", f"/v1/work/{_quote(work_id)}", None, WorkDetail)

    async def send_input(self, work_id: str, req: InputRequest) -> EventView:
        return self.request("POST", f"/v1/work/{_quote(work_id)}/input", req, EventView)

    async def inject(self, work_id: str, req: InputRequest) -> EventView:
        return self.request("POST", f"/v1/work/{_quote(work_id)}/inject", req, EventView)

    async def cancel(self, work_id: str, req: CancelRequest) -> WorkDetail:
        return self.request("POST", f"/v1/work/{_quote(work_id)}/cancel", req, WorkDetail)

    async def retry(self, work_id: str, req: RetryRequest) -> WorkDetail:
        return self.request("POST", f"/v1/work/{_quote(work_id)}/retry", req, WorkDetail)

    async def confirm_stopped(self, work_id: str, req: ConfirmStoppedRequest) -> WorkDetail:
        path = f"/v1/work/{_quote(work_id)}/confirm-stopped"
        return self.request("POST", path, req, WorkDetail)

    async def interrupt(self, work_id: str, req: InterruptRequest) -> WorkDetail:
        return self.request("POST", f"/v1/work/{_quote(work_id)}/interrupt", req, WorkDetail)

    async def history(
        self, work_id: str, *, limit: int = 100, after: str | None = None, newest: bool = False
    ) -> HistoryPage:
        query: dict[str, Any] = {"limit": limit, "order": "newest" if newest else "oldest"}
        if after is not None:
            query["after"] = after
        path = f"/v1/work/{_quote(work_id)}/history?{urlencode(query)}"
        return self.request("GET", path, None, HistoryPage)

    async def output(self, work_id: str, attempt: int, stream: str, tail: int) -> OutputTail:
        query = urlencode({"stream": stream, "tail": tail})
        path = f"/v1/work/{_quote(work_id)}/attempts/{attempt}/output?{query}"
        return self.request("GET", path, None, OutputTail)

    async def capacity(self) -> CapacityView:
        return self.request("GET", "/v1/capacity", None, CapacityView)

    async def health(self) -> Health:
        return self.request("GET", "/v1/health", None, Health)

    async def daemons(self) -> DaemonList:
        return self.request("GET", "/v1/daemons", None, DaemonList)

    async def drain(self) -> DrainView:
        return self.request("POST", "/v1/daemon/drain", None, DrainView)


def _quote(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")
