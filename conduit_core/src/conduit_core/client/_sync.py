"""The blocking client: one kept-alive HTTP/1.1 connection (stdlib ``http.client``)."""

from __future__ import annotations

import builtins
import http.client
import os
import select
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

from conduit_core.client._address import Address, resolve
from conduit_core.client._calls import Call, Calls, Poll, chunks, decode, merge_batches, outcome
from conduit_core.client._errors import Conflict, DaemonUnavailable
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

__all__ = ["Client", "headers", "unreachable"]

R = TypeVar("R")
T = TypeVar("T")

def headers(token: str, *, keep_alive: bool = False) -> dict[str, str]:
    fields = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json",
        "Content-Type": "application/json",
    }
    if not keep_alive:
        fields["Connection"] = "close"
    return fields


#: What a kept-alive connection the daemon closed as a request went out raises: the request
#: was not taken (no answer began), so it is sent again once on a new connection.
_RESENDABLE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


def _closed_by_peer(sock: socket.socket) -> bool:
    """Readable while idle: the daemon closed it (or sent what no request asked for)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _exchange(
    conn: http.client.HTTPConnection, call: Call[Any], token: str
) -> tuple[int, bytes, bool]:
    """Send ``call`` on ``conn``; the status, the body and whether the connection stays open."""
    conn.request(call.method, call.path, body=call.body, headers=headers(token, keep_alive=True))
    reply = conn.getresponse()
    raw = reply.read()
    return reply.status, raw, not reply.will_close


def unreachable(address: Address, exc: BaseException) -> DaemonUnavailable:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return DaemonUnavailable(
        f"the daemon at {address.where} is not reachable ({text}); is `conduit daemon` running?",
        code="daemon_unreachable",
    )


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Client:
    """A blocking client of a running daemon's HTTP API.

    ``Client()`` finds the daemon as documented in docs/python.md: ``url``/``token``
    arguments, else ``CONDUIT_URL``/``CONDUIT_TOKEN``, else the config file ``config`` (or
    ``CONDUIT_CONFIG``, else ./conduit.toml) and its token file. It keeps its connections
    alive between calls (one per thread calling at once), so threads may share it; ``close()``
    or a ``with`` block closes them.
    """

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
        self._lock = threading.Lock()
        self._idle: builtins.list[http.client.HTTPConnection] = []

    # --- transport -----------------------------------------------------------------------------

    def _connect(self) -> http.client.HTTPConnection:
        a: Address = self.address
        if a.unix_socket:
            return _UnixConnection(a.unix_socket, self.timeout)
        return http.client.HTTPConnection(a.host, a.port, timeout=self.timeout)

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """An idle kept-alive connection (``True``: reused), else a new one (``False``)."""
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.sock is not None and not _closed_by_peer(conn.sock):
                    return conn, True
                conn.close()  # the daemon closed it while idle (its keep-alive timeout)
        return self._connect(), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append(conn)

    def _call(self, call: Call[R]) -> R:
        conn, reused = self._take()
        try:
            status, raw, keep = _exchange(conn, call, self._token)
        except _RESENDABLE as exc:
            conn.close()
            if not reused:
                raise unreachable(self.address, exc) from exc
            # The daemon closed the kept-alive connection as the request went out, without
            # answering: it did not take the request. Once more, on a new connection.
            conn, reused = self._connect(), False
            try:
                status, raw, keep = _exchange(conn, call, self._token)
            except (OSError, http.client.HTTPException) as again:
                conn.close()
                raise unreachable(self.address, again) from again
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise unreachable(self.address, exc) from exc
        if keep:
            self._give_back(conn)
        else:
            conn.close()
        return decode(call, status, raw)

    def close(self) -> None:
        """Close the kept-alive connections (a later call opens a new one)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the API -------------------------------------------------------------------------------

    def submit(
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
        """Create Work for ``binding`` with ``input`` as its first input's payload.

        With an ``id``, a resend is refused (:class:`Conflict`, ``work_exists``); with
        ``exist_ok=True`` it returns the stored Work instead (an idempotent submit).
        ``priority`` (-10 to 10; ``None``: the binding's): claimed higher first, aged.
        ``after``: ids of Work that must complete first; ``on_dependency_failure``:
        ``cancel`` (default), ``hold`` or ``run`` when one fails or is cancelled.

        With ``dedup_key`` (scope ``dedup="queued"`` or ``"active"``, or ``dedup_window="10m"``)
        or ``debounce=Debounce(key=…, quiet="5s", max_wait="1m")``, a submit the key already
        names returns that Work with ``deduplicated`` true (docs/dedup.md).
        """
        item = SubmitItem(
            binding=binding, input=input, scope=scope, kind=kind, id=id, priority=priority,
            after=list(after), on_dependency_failure=on_dependency_failure, dedup_key=dedup_key,
            dedup=dedup, dedup_window=dedup_window, debounce=debounce,
        )  # fmt: skip
        try:
            return self._call(Calls.submit(item))
        except Conflict as exc:
            if not (exist_ok and id is not None and exc.code == "work_exists"):
                raise
            return self.get(id)

    def submit_many(self, items: Iterable[SubmitItem]) -> BatchResult:
        """Submit many (``POST /v1/work/batch``, 1,000 a request): each item is created or
        refused on its own; the result lists them in the order given."""
        return merge_batches([self._call(Calls.batch(chunk)) for chunk in chunks(items)])

    def get(self, work_id: str) -> WorkDetail:
        return self._call(Calls.get(work_id))

    @overload
    def wait(
        self,
        work_id: str,
        *,
        timeout: float | None = ...,
        data_type: None = ...,
        poll_max: float = ...,
    ) -> Outcome[dict[str, Any]]: ...

    @overload
    def wait(
        self,
        work_id: str,
        *,
        timeout: float | None = ...,
        data_type: type[T],
        poll_max: float = ...,
    ) -> Outcome[T]: ...

    def wait(
        self,
        work_id: str,
        *,
        timeout: float | None = 60.0,
        data_type: type[Any] | None = None,
        poll_max: float = 1.0,
    ) -> Outcome[Any]:
        """Poll (with backoff, at most ``poll_max`` s apart) until the Work is completed,
        failed or cancelled, or blocked until a person retries it; its :class:`Outcome`, with
        the result's data decoded into ``data_type``. :class:`WaitTimeout` at the deadline."""
        poll = Poll(timeout, longest=poll_max)
        while True:
            detail = self.get(work_id)
            if detail.work.settled:
                return outcome(detail, data_type)
            time.sleep(poll.next_delay(f"work {work_id} is still {detail.work.status}"))

    @overload
    def wait_many(
        self,
        work_ids: Iterable[str],
        *,
        timeout: float | None = ...,
        data_type: None = ...,
        poll_max: float = ...,
    ) -> builtins.list[Outcome[dict[str, Any]]]: ...

    @overload
    def wait_many(
        self,
        work_ids: Iterable[str],
        *,
        timeout: float | None = ...,
        data_type: type[T],
        poll_max: float = ...,
    ) -> builtins.list[Outcome[T]]: ...

    def wait_many(
        self,
        work_ids: Iterable[str],
        *,
        timeout: float | None = 60.0,
        data_type: type[Any] | None = None,
        poll_max: float = 1.0,
    ) -> builtins.list[Outcome[Any]]:
        """:meth:`wait` for each Work (one deadline for all); outcomes in the order given."""
        ids = builtins.list(work_ids)
        done: dict[str, Outcome[Any]] = {}
        poll = Poll(timeout, longest=poll_max)
        while True:
            for work_id in ids:
                if work_id not in done:
                    detail = self.get(work_id)
                    if detail.work.settled:
                        done[work_id] = outcome(detail, data_type)
            left = len(ids) - len(done)
            if not left:
                return [done[work_id] for work_id in ids]
            time.sleep(poll.next_delay(f"{left} of {len(ids)} Works are not finished"))

    def cancel(self, work_id: str, reason: str = "") -> WorkDetail:
        return self._call(Calls.cancel(work_id, reason))

    def retry(self, work_id: str, reason: str = "") -> WorkDetail:
        return self._call(Calls.retry(work_id, reason))

    def approve(self, work_id: str, reason: str = "") -> Settled:
        """Approve the human gate's hold on the Work (see docs/budgets-and-gates.md)."""
        return self._call(Calls.settle(work_id, "approve", reason))

    def refuse(self, work_id: str, reason: str = "") -> Settled:
        """Refuse the human gate's hold: the Work is cancelled."""
        return self._call(Calls.settle(work_id, "refuse", reason))

    def list(
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
        """One page of Work matching every filter given, newest first (``order="oldest"`` for
        the other way; ``limit`` 1-500); pass ``page.next`` as ``after``. ``status`` may be
        ``exhausted``; ``since``/``until`` ISO-8601 with an offset or ``-1h``; ``input``
        matches top-level keys of the first input (docs/http.md, "Search")."""
        filters = {
            "status": status, "scope": scope, "binding": binding, "id": id,
            "id_prefix": id_prefix, "since": since, "until": until, "input": input,
            "order": order,
        }  # fmt: skip
        return self._call(Calls.list(limit, after, filters))

    def iter_work(self, *, page_size: int = 500, **filters: Any) -> Iterator[WorkView]:
        """Every matching Work, page after page."""
        after: str | None = None
        while True:
            page = self.list(limit=page_size, after=after, **filters)
            yield from page.items
            if page.next is None:
                return
            after = page.next

    def inputs(
        self,
        work_id: str,
        payload: Any = None,
        *,
        type: str = "core.input",
        correlation_key: str | None = None,
        delivery_id: str | None = None,
    ) -> InputAccepted:
        """Send an input to the Work; ``delivery_id`` makes a resend idempotent."""
        return self._call(Calls.input(work_id, payload, type, correlation_key, delivery_id))

    def health(self) -> dict[str, Any]:
        return self._call(Calls.health())

    def daemons(self) -> DaemonList:
        """The daemons on the store: host, labels, state, load, last seen (``GET /v1/daemons``)."""
        return self._call(Calls.daemons())

    def drain(self) -> DrainView:
        """Drain the daemon this client talks to (an admin token): it claims nothing new, its
        running attempts finish, then it exits 0. Idempotent."""
        return self._call(Calls.drain())
