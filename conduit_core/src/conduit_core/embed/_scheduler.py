"""Submit, read and wait in the process that runs the scheduler: no HTTP, the client's records.

The calls go through the same service the HTTP API answers from (the same checks, the same
stable error codes) and return :mod:`conduit_core.client`'s records and exceptions, so code
written against :class:`~conduit_core.client.AsyncClient` reads the same embedded.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterable
from typing import Any, TypeVar, overload

import msgspec

from conduit_core.client import (
    BatchItemResult,
    BatchResult,
    ConduitClientError,
    Conflict,
    Debounce,
    InvalidRequest,
    Outcome,
    SubmitItem,
    WaitTimeout,
    WorkDetail,
    error_for,
    outcome,
)
from conduit_core.embed._assembly import Assembly
from conduit_core.errors import ConduitError
from conduit_core.http import (
    MAX_BATCH_ITEMS,
    ApiService,
    BatchSubmitRequest,
    CancelRequest,
    RetryRequest,
    status_for,
)
from conduit_core.http import SubmitRequest as _SubmitRequest

__all__ = ["EmbeddedScheduler"]

T = TypeVar("T")
R = TypeVar("R")


def _as(value: msgspec.Struct, typ: type[R]) -> R:
    return msgspec.convert(msgspec.to_builtins(value), typ)


def _request(item: SubmitItem) -> _SubmitRequest:
    try:
        return msgspec.convert(msgspec.to_builtins(item), _SubmitRequest)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid submit: {exc}", code="invalid_body", status=422) from exc


def _client_error(exc: ConduitError) -> ConduitClientError:
    """The exception :class:`~conduit_core.client.Client` raises for this refusal."""
    return error_for(status_for(exc), exc.message, exc.code)


class EmbeddedScheduler(Assembly):
    """The scheduler in this process (``async with embed.run(config) as scheduler``), with the
    client's calls: ``submit``, ``submit_many``, ``get``, ``wait``, ``cancel``, ``retry``.
    Refusals raise the client's exceptions (:class:`~conduit_core.client.ConduitClientError`,
    with the API's stable ``code``)."""

    def _api(self) -> ApiService:
        if self.service is None:
            raise ConduitClientError("the embedded scheduler is not started", code="not_started")
        return self.service

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
        dedup_key: str | None = None,
        dedup: str | None = None,
        dedup_window: str | None = None,
        debounce: Debounce | None = None,
    ) -> WorkDetail:
        """As :meth:`conduit_core.client.Client.submit`."""
        item = SubmitItem(
            binding=binding, input=input, scope=scope, kind=kind, id=id, priority=priority,
            dedup_key=dedup_key, dedup=dedup, dedup_window=dedup_window, debounce=debounce,
        )  # fmt: skip
        try:
            detail = await self._api().submit(_request(item))
        except ConduitError as exc:
            error = _client_error(exc)
            if not (exist_ok and id is not None and isinstance(error, Conflict)
                    and error.code == "work_exists"):  # fmt: skip
                raise error from exc
            return await self.get(id)
        return _as(detail, WorkDetail)

    async def submit_many(self, items: Iterable[SubmitItem]) -> BatchResult:
        """As :meth:`conduit_core.client.Client.submit_many`: each item created or refused
        on its own, in one store transaction per 1,000."""
        requests = [_request(item) for item in items]
        merged: builtins.list[BatchItemResult] = []
        for start in range(0, len(requests), MAX_BATCH_ITEMS):
            chunk = requests[start : start + MAX_BATCH_ITEMS]
            try:
                batch = await self._api().submit_batch(BatchSubmitRequest(items=chunk))
            except ConduitError as exc:
                raise _client_error(exc) from exc
            result = _as(batch, BatchResult)  # each chunk's index counts from 0: over all here
            merged += (msgspec.structs.replace(i, index=i.index + start) for i in result.items)
        created = sum(item.created for item in merged)
        joined = sum(item.deduplicated for item in merged)
        return BatchResult(items=merged, created=created, refused=len(merged) - created - joined,
                           deduplicated=joined)  # fmt: skip

    async def get(self, work_id: str) -> WorkDetail:
        try:
            return _as(await self._api().show(work_id), WorkDetail)
        except ConduitError as exc:
            raise _client_error(exc) from exc

    @overload
    async def wait(
        self,
        work_id: str,
        *,
        timeout: float | None = ...,  # noqa: ASYNC109
        data_type: None = ...,
    ) -> Outcome[dict[str, Any]]: ...

    @overload
    async def wait(
        self,
        work_id: str,
        *,
        timeout: float | None = ...,  # noqa: ASYNC109
        data_type: type[T],
    ) -> Outcome[T]: ...

    async def wait(
        self,
        work_id: str,
        *,
        timeout: float | None = 60.0,  # noqa: ASYNC109 - the twin of Client.wait's deadline
        data_type: type[Any] | None = None,
    ) -> Outcome[Any]:
        """As :meth:`conduit_core.client.Client.wait`; woken as soon as an attempt run here
        ends (a Work another process runs is read again at most a second apart)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.05
        while True:
            detail = await self.get(work_id)
            if detail.work.settled:
                return outcome(detail, data_type)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"work {work_id} is still {detail.work.status} after {timeout:g} s",
                    code="wait_timeout",
                )
            left = float("inf") if deadline is None else deadline - time.monotonic()
            await self.attempt_ended(max(0.0, min(delay, left)))
            delay = min(delay * 1.5, 1.0)

    async def cancel(self, work_id: str, reason: str = "") -> WorkDetail:
        try:
            detail = await self._api().cancel(work_id, CancelRequest(reason=reason))
        except ConduitError as exc:
            raise _client_error(exc) from exc
        return _as(detail, WorkDetail)

    async def retry(self, work_id: str, reason: str = "") -> WorkDetail:
        try:
            detail = await self._api().retry(work_id, RetryRequest(reason=reason))
        except ConduitError as exc:
            raise _client_error(exc) from exc
        return _as(detail, WorkDetail)
