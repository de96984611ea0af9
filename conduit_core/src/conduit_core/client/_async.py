"""The async client (anyio: asyncio or trio): a small pool of kept-alive HTTP/1.1 connections."""

from __future__ import annotations

import builtins
import os
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from conduit_core.client._address import resolve
from conduit_core.client._calls import Call, Calls, Poll, chunks, decode, merge_batches, outcome
from conduit_core.client._errors import Conflict
from conduit_core.client._sync import headers, unreachable
from conduit_core.client._types import (
    BatchResult,
    DaemonList,
    Debounce,
    DrainView,
    InputAccepted,
    Outcome,
    Settled,
    SubmitItem,
    WorkDetail,
    WorkPage,
    WorkView,
)

if TYPE_CHECKING:
    from anyio.abc import ByteStream

__all__ = ["AsyncClient"]

R = TypeVar("R")
T = TypeVar("T")

_MAX_HEAD = 64 * 1024


async def _abandon(conn: _Connection) -> None:
    """Close a connection whose exchange did not finish (its state is unknown)."""
    import anyio

    with anyio.CancelScope(shield=True):
        await conn.stream.aclose()


class _Connection:
    """One kept-alive connection and the reader that buffers what it received."""

    def __init__(self, stream: ByteStream) -> None:
        from anyio.streams.buffered import BufferedByteReceiveStream

        self.stream = stream
        self.reader = BufferedByteReceiveStream(stream)

    async def exchange(self, request: bytes) -> tuple[int, bytes, bool]:
        """Send one request and read the whole answer: status, body, and whether the
        connection stays open. :class:`_NotTaken` when the daemon closed it before answering."""
        import anyio

        reader = self.reader

        async def line() -> bytes:
            return await reader.receive_until(b"\r\n", _MAX_HEAD)

        try:
            await self.stream.send(request)
            first = await line()
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.IncompleteRead,
                ConnectionError) as exc:  # fmt: skip
            raise _NotTaken from exc
        status = int(first.split(b" ", 2)[1])
        fields: dict[bytes, bytes] = {}
        while head := await line():
            name, _, value = head.partition(b":")
            fields[name.strip().lower()] = value.strip()
        keep = fields.get(b"connection", b"").lower() != b"close"
        if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = bytearray()
            while size := int((await line()).split(b";")[0], 16):
                body += await reader.receive_exactly(size)
                await reader.receive_exactly(2)
            await reader.receive_exactly(2)  # the blank line after the last chunk
            return status, bytes(body), keep
        length = int(fields.get(b"content-length", b"0"))
        return status, await reader.receive_exactly(length), keep


class _NotTaken(Exception):
    """The daemon closed a kept-alive connection as the request went out, before any answer:
    it did not take the request (sent again once, on a new connection)."""


class AsyncClient:
    """The async twin of :class:`~conduit_core.client.Client` (same arguments and methods,
    awaited). Safe to share between tasks: it keeps its connections alive between calls, one
    per task calling at once; ``aclose()`` or an ``async with`` block closes them."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        config: str | os.PathLike[str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.address, self._token = resolve(url, token, config)
        self.timeout = timeout
        #: Kept-alive connections no task is using (tasks calling at once use one each).
        self._idle: builtins.list[_Connection] = []

    # --- transport -----------------------------------------------------------------------------

    def _request_bytes(self, call: Call[Any]) -> bytes:
        a = self.address
        host = "localhost" if a.unix_socket else f"{a.host}:{a.port}"
        body = call.body or b""
        head = [f"{call.method} {call.path} HTTP/1.1", f"Host: {host}",
                f"Content-Length: {len(body)}"]  # fmt: skip
        fields = headers(self._token, keep_alive=True)
        head += [f"{name}: {value}" for name, value in fields.items()]
        return ("\r\n".join(head) + "\r\n\r\n").encode() + body

    async def _connect(self) -> _Connection:
        import anyio

        a = self.address
        if a.unix_socket:
            stream: ByteStream = await anyio.connect_unix(a.unix_socket)
        else:
            stream = await anyio.connect_tcp(a.host, a.port)
        return _Connection(stream)

    async def _send(self, call: Call[Any]) -> tuple[int, bytes]:
        request = self._request_bytes(call)
        conn = self._idle.pop() if self._idle else None
        if conn is not None:
            try:
                status, raw, keep = await conn.exchange(request)
            except _NotTaken:
                await conn.stream.aclose()
                conn = None
            except BaseException:
                await _abandon(conn)
                raise
        if conn is None:
            conn = await self._connect()
            try:
                status, raw, keep = await conn.exchange(request)
            except BaseException:
                await _abandon(conn)
                raise
        if keep:
            self._idle.append(conn)
        else:
            await conn.stream.aclose()
        return status, raw

    async def _call(self, call: Call[R]) -> R:
        import anyio

        try:
            with anyio.fail_after(self.timeout):
                status, raw = await self._send(call)
        except (OSError, TimeoutError, anyio.BrokenResourceError, anyio.EndOfStream,
                anyio.IncompleteRead, anyio.DelimiterNotFound, ValueError, IndexError,
                _NotTaken) as exc:  # fmt: skip
            raise unreachable(self.address, exc) from exc
        return decode(call, status, raw)

    async def aclose(self) -> None:
        """Close the kept-alive connections (a later call opens a new one)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await _abandon(conn)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- the API (see Client for each method) -------------------------------------------------

    async def submit(
        self,
        binding: str,
        input: Any = None,
        *,
        scope: str | None = None,
        kind: str = "task",
        id: str | None = None,
        exist_ok: bool = False,
        priority: int | None = None,
        after: Sequence[str] = (),
        on_dependency_failure: str | None = None,
        dedup_key: str | None = None,
        dedup: str | None = None,
        dedup_window: str | None = None,
        debounce: Debounce | None = None,
    ) -> WorkDetail:
        item = SubmitItem(
            binding=binding, input=input, scope=scope, kind=kind, id=id, priority=priority,
            after=list(after), on_dependency_failure=on_dependency_failure, dedup_key=dedup_key,
            dedup=dedup, dedup_window=dedup_window, debounce=debounce,
        )  # fmt: skip
        try:
            return await self._call(Calls.submit(item))
        except Conflict as exc:
            if not (exist_ok and id is not None and exc.code == "work_exists"):
                raise
            return await self.get(id)

    async def submit_many(self, items: Iterable[SubmitItem]) -> BatchResult:
        return merge_batches([await self._call(Calls.batch(chunk)) for chunk in chunks(items)])

    async def get(self, work_id: str) -> WorkDetail:
        return await self._call(Calls.get(work_id))

    @overload
    async def wait(
        self,
        work_id: str,
        *,
        timeout: float | None = ...,  # noqa: ASYNC109
        data_type: None = ...,
        poll_max: float = ...,
    ) -> Outcome[dict[str, Any]]: ...

    @overload
    async def wait(
        self,
        work_id: str,
        *,
        timeout: float | None = ...,  # noqa: ASYNC109
        data_type: type[T],
        poll_max: float = ...,
    ) -> Outcome[T]: ...

    async def wait(
        self,
        work_id: str,
        *,
        timeout: float | None = 60.0,  # noqa: ASYNC109 - the twin of Client.wait's deadline
        data_type: type[Any] | None = None,
        poll_max: float = 1.0,
    ) -> Outcome[Any]:
        import anyio

        poll = Poll(timeout, longest=poll_max)
        while True:
            detail = await self.get(work_id)
            if detail.work.settled:
                return outcome(detail, data_type)
            await anyio.sleep(poll.next_delay(f"work {work_id} is still {detail.work.status}"))

    @overload
    async def wait_many(
        self,
        work_ids: Iterable[str],
        *,
        timeout: float | None = ...,  # noqa: ASYNC109
        data_type: None = ...,
        poll_max: float = ...,
    ) -> builtins.list[Outcome[dict[str, Any]]]: ...

    @overload
    async def wait_many(
        self,
        work_ids: Iterable[str],
        *,
        timeout: float | None = ...,  # noqa: ASYNC109
        data_type: type[T],
        poll_max: float = ...,
    ) -> builtins.list[Outcome[T]]: ...

    async def wait_many(
        self,
        work_ids: Iterable[str],
        *,
        timeout: float | None = 60.0,  # noqa: ASYNC109 - the twin of Client.wait's deadline
        data_type: type[Any] | None = None,
        poll_max: float = 1.0,
    ) -> builtins.list[Outcome[Any]]:
        import anyio

        ids = builtins.list(work_ids)
        done: dict[str, Outcome[Any]] = {}
        poll = Poll(timeout, longest=poll_max)
        while True:
            for work_id in ids:
                if work_id not in done:
                    detail = await self.get(work_id)
                    if detail.work.settled:
                        done[work_id] = outcome(detail, data_type)
            left = len(ids) - len(done)
            if not left:
                return [done[work_id] for work_id in ids]
            await anyio.sleep(poll.next_delay(f"{left} of {len(ids)} Works are not finished"))

    async def cancel(self, work_id: str, reason: str = "") -> WorkDetail:
        return await self._call(Calls.cancel(work_id, reason))

    async def retry(self, work_id: str, reason: str = "") -> WorkDetail:
        return await self._call(Calls.retry(work_id, reason))

    async def approve(self, work_id: str, reason: str = "") -> Settled:
        return await self._call(Calls.settle(work_id, "approve", reason))

    async def refuse(self, work_id: str, reason: str = "") -> Settled:
        return await self._call(Calls.settle(work_id, "refuse", reason))

    async def list(
        self,
        *,
        status: str | None = None,
        scope: str | None = None,
        binding: str | None = None,
        id: str | None = None,
        id_prefix: str | None = None,
        since: str | None = None,
        until: str | None = None,
        input: Mapping[str, str] | None = None,
        order: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> WorkPage:
        filters = {
            "status": status, "scope": scope, "binding": binding, "id": id,
            "id_prefix": id_prefix, "since": since, "until": until, "input": input,
            "order": order,
        }  # fmt: skip
        return await self._call(Calls.list(limit, after, filters))

    async def iter_work(self, *, page_size: int = 500, **filters: Any) -> AsyncIterator[WorkView]:
        after: str | None = None
        while True:
            page = await self.list(limit=page_size, after=after, **filters)
            for item in page.items:
                yield item
            if page.next is None:
                return
            after = page.next

    async def inputs(
        self,
        work_id: str,
        payload: Any = None,
        *,
        type: str = "core.input",
        correlation_key: str | None = None,
        delivery_id: str | None = None,
    ) -> InputAccepted:
        return await self._call(Calls.input(work_id, payload, type, correlation_key, delivery_id))

    async def health(self) -> dict[str, Any]:
        return await self._call(Calls.health())

    async def daemons(self) -> DaemonList:
        return await self._call(Calls.daemons())

    async def drain(self) -> DrainView:
        return await self._call(Calls.drain())
