"""The API calls both clients make: request (method, path, body) and how the answer decodes.

The sync and async clients differ only in how they send bytes and sleep; everything about the
API itself is here, once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

import msgspec

from conduit_core.client._errors import ConduitClientError, WaitTimeout, error_for
from conduit_core.client._types import (
    BatchItemResult,
    BatchResult,
    DaemonList,
    DrainView,
    InputAccepted,
    Outcome,
    Settled,
    SubmitItem,
    WorkDetail,
    WorkPage,
)

__all__ = ["MAX_BATCH_ITEMS", "Call", "Poll", "Calls", "decode", "merge_batches", "outcome"]

R = TypeVar("R")
T = TypeVar("T")

#: Items one ``POST /v1/work/batch`` takes; ``submit_many`` sends larger lists in chunks.
MAX_BATCH_ITEMS = 1000

_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True)
class Call(Generic[R]):
    method: str
    path: str
    body: bytes | None
    response: type[R]


class _Error(msgspec.Struct):
    error: str = ""
    code: str = "daemon_error"


def decode(call: Call[R], status: int, raw: bytes) -> R:
    """The answer to ``call``, or the API's error raised as a :class:`ConduitClientError`."""
    if status >= 400:
        try:
            body = msgspec.json.decode(raw, type=_Error)
        except msgspec.DecodeError:
            body = _Error(f"the daemon answered {status} to {call.method} {call.path}")
        raise error_for(status, body.error or f"the daemon answered {status}", body.code)
    try:
        return msgspec.json.decode(raw, type=call.response)
    except msgspec.DecodeError as exc:
        raise ConduitClientError(
            f"the daemon's answer to {call.method} {call.path} did not decode: {exc}",
            code="invalid_answer",
            status=status,
        ) from exc


def _work(work_id: str, action: str = "") -> str:
    return f"/v1/work/{quote(work_id, safe='')}{action}"


def _reason(reason: str) -> bytes:
    return _ENCODER.encode({"reason": reason})


class Calls:
    """Builders of each call (no I/O)."""

    @staticmethod
    def submit(item: SubmitItem) -> Call[WorkDetail]:
        return Call("POST", "/v1/work", _ENCODER.encode(item), WorkDetail)

    @staticmethod
    def batch(items: Sequence[SubmitItem]) -> Call[BatchResult]:
        body = _ENCODER.encode({"items": list(items)})
        return Call("POST", "/v1/work/batch", body, BatchResult)

    @staticmethod
    def get(work_id: str) -> Call[WorkDetail]:
        return Call("GET", _work(work_id), None, WorkDetail)

    @staticmethod
    def list(limit: int, after: str | None, filters: Mapping[str, Any]) -> Call[WorkPage]:
        """``GET /v1/work`` with the search's filters (``input`` a mapping: ``input.KEY``)."""
        query: dict[str, Any] = {"limit": limit}
        for key, value in filters.items():
            if key == "input":
                query.update({f"input.{k}": v for k, v in (value or {}).items()})
            elif value is not None:
                query[key] = value
        if after is not None:
            query["after"] = after
        return Call("GET", f"/v1/work?{urlencode(query)}", None, WorkPage)

    @staticmethod
    def cancel(work_id: str, reason: str) -> Call[WorkDetail]:
        return Call("POST", _work(work_id, "/cancel"), _reason(reason), WorkDetail)

    @staticmethod
    def retry(work_id: str, reason: str) -> Call[WorkDetail]:
        return Call("POST", _work(work_id, "/retry"), _reason(reason), WorkDetail)

    @staticmethod
    def settle(work_id: str, action: str, reason: str) -> Call[Settled]:
        return Call("POST", _work(work_id, f"/{action}"), _reason(reason), Settled)

    @staticmethod
    def input(
        work_id: str,
        payload: Any,
        type: str,
        correlation_key: str | None,
        delivery_id: str | None,
    ) -> Call[InputAccepted]:
        body: dict[str, Any] = {"payload": payload, "type": type}
        if correlation_key is not None:
            body["correlation_key"] = correlation_key
        if delivery_id is not None:
            body["delivery_id"] = delivery_id
        return Call("POST", _work(work_id, "/input"), _ENCODER.encode(body), InputAccepted)

    @staticmethod
    def health() -> Call[dict[str, Any]]:
        return Call("GET", "/v1/health", None, dict)

    @staticmethod
    def daemons() -> Call[DaemonList]:
        return Call("GET", "/v1/daemons", None, DaemonList)

    @staticmethod
    def drain() -> Call[DrainView]:
        return Call("POST", "/v1/daemon/drain", None, DrainView)


def chunks(items: Iterable[SubmitItem]) -> list[list[SubmitItem]]:
    batch = list(items)
    return [batch[i : i + MAX_BATCH_ITEMS] for i in range(0, len(batch), MAX_BATCH_ITEMS)]


def merge_batches(results: Sequence[BatchResult]) -> BatchResult:
    """One result over every chunk, ``index`` counted over all the items given."""
    items: list[BatchItemResult] = []
    for result in results:
        offset = len(items)
        items.extend(msgspec.structs.replace(item, index=item.index + offset)
                     for item in result.items)  # fmt: skip
    return BatchResult(
        items=items,
        created=sum(r.created for r in results),
        refused=sum(r.refused for r in results),
        deduplicated=sum(r.deduplicated for r in results),
    )


def outcome(detail: WorkDetail, data_type: type[T] | None) -> Outcome[T]:
    """A finished Work's :class:`Outcome`, its last result's data decoded into ``data_type``
    (public: :mod:`conduit_core.embed` builds its outcomes with it too)."""
    work = detail.work
    last = detail.attempts[-1] if detail.attempts else None
    result = last.result if last is not None else None
    raw = result.data if result is not None else {}
    data: Any = None
    if work.status == "completed":
        if data_type is None:
            data = raw
        else:
            try:
                data = msgspec.convert(raw, type=data_type)
            except msgspec.ValidationError as exc:
                raise ConduitClientError(
                    f"work {work.id}'s result data does not fit {_name(data_type)}: {exc}",
                    code="invalid_result_data",
                ) from exc
    return Outcome(
        id=work.id,
        status=work.status,
        data=data,
        raw_data=raw,
        summary=result.summary if result is not None else "",
        failure_code=last.failure_code if last is not None else None,
        failure_message=last.failure_message if last is not None else None,
        blocked_reason=work.blocked_reason if work.blocked else None,
        attempts=len(detail.attempts),
    )


def _name(data_type: Any) -> str:
    return getattr(data_type, "__name__", None) or repr(data_type)


class Poll:
    """Backoff between polls (from ``first`` s, x1.5, at most ``longest``) until ``timeout``."""

    def __init__(self, timeout: float | None, first: float = 0.02, longest: float = 1.0) -> None:
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.delay = first
        self.longest = longest

    def next_delay(self, what: str) -> float:
        """How long to sleep before the next poll; :class:`WaitTimeout` past the deadline."""
        delay = self.delay
        self.delay = min(self.delay * 1.5, self.longest)
        if self.deadline is None:
            return delay
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(f"{what} after {self.timeout:g} s", code="wait_timeout")
        return min(delay, left)
