"""``GET /metrics``: the Prometheus exposition of the hot-path instruments and of stored state.

Counters and histograms come from :data:`telemetry.METRICS` (recorded as things happen). The
gauges that mirror stored state are computed from the store at each scrape, by the same code the
API answers with (``ApiService.capacity`` for ``/v1/capacity``), so a scrape and the API never
disagree: capacity in use and limit per pool and scope, Work per status and startable, holds by
kind. The one exception is the count of ended Work (``completed``, ``failed``, ``cancelled``),
which grows with the history: it is re-read only when older than ``EndedCounts.COST_RATIO``
times what its last read took (``EndedCounts``), so a long history costs scrapes at most a
hundredth of the time. A store that does not answer yields ``conduit_store_up 0`` and no
stored-state gauges, never a failed scrape.

The endpoint wants the API's bearer token unless ``[settings.metrics] open = true``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from conduit_core.errors import ConduitError
from conduit_core.http._guard import bearer_check
from conduit_core.http._service import ApiService
from conduit_core.http._tokens import LoginThrottle, TokenSet, client_address
from conduit_core.storage import Store
from conduit_core.telemetry import METRICS, Metrics

__all__ = [
    "METRICS_PATH", "EndedCounts", "MetricsEndpoint", "stored_state_metrics", "with_metrics"
]

log = logging.getLogger("conduit.http")

METRICS_PATH = "/metrics"


class EndedCounts:
    """The ended Work's counts for ``/metrics``, kept between scrapes.

    Counting ended Work reads every ended Work's entry in the status index (there is no
    counter to read instead: a counter row written by every settlement would be one row every
    daemon's settlements wait for). So the counts are re-read only when they are older than
    ``COST_RATIO`` times what their last read took: a store with little history is counted
    afresh at every scrape; one where the count takes 0.4 s (2 million ended Work on
    PostgreSQL) at most every 40 s. Scrapes spend at most 1/``COST_RATIO`` of the time there,
    and ``conduit_work_ended_counts_age_seconds`` says how old the counts are."""

    COST_RATIO = 100

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = anyio.Lock()
        self._store: object = None
        self._counts: dict[str, int] = {}
        self._read_at = 0.0
        self._took = 0.0

    async def read(self, store: Store) -> tuple[dict[str, int], float]:
        """The counts and their age in seconds; read afresh when due (one read at a time: a
        scrape that finds a read under way takes its result)."""
        async with self._lock:
            now = self._clock()
            if store is not self._store or now - self._read_at >= self._took * self.COST_RATIO:
                counts = await store.ended_work_counts()
                ended = self._clock()
                self._store, self._counts = store, counts
                self._read_at, self._took = ended, ended - now
                now = ended
            return dict(self._counts), now - self._read_at


async def stored_state_metrics(
    service: ApiService, ended: EndedCounts | None = None
) -> list[Metric]:
    """The gauges that mirror the store, read now but for the ended Work's counts (``ended``
    keeps them between scrapes; without it they are read now). Raises the store's
    ``ConduitError``."""
    capacity = await service.capacity()
    counts = await service.store.work_counts()
    ended_counts, ended_seconds = await (ended or EndedCounts()).read(service.store)
    counts |= ended_counts
    held = await service.store.held_work()
    summary = await service.store.ready_summary()
    depth = {binding: count for binding, (count, _) in summary.items()}
    recoveries = await service.store.held_recoveries()
    unconfirmed = await service.store.unconfirmed_exclusions()
    now_ms = service.scheduler.clock.now_ms()

    pools = _slot_families("pool", capacity.pools, "Attempts holding a slot of the pool")
    scopes = _slot_families(
        "scope",
        capacity.scopes,
        "Attempts holding a slot of the scope (its own and its sub-scopes')",
    )
    keys_waiting = GaugeMetricFamily(
        "conduit_keys_waiting",
        "Ready Work waiting for a concurrency key at its limit, over every key (no label per "
        "key: /v1/capacity lists the keys)",
        value=capacity.keys_waiting,
    )
    work = GaugeMetricFamily("conduit_work", "Work per status", labels=["status"])
    for status, count in sorted(counts.items()):
        if status != "startable":
            work.add_metric([status], count)
    ended_age = GaugeMetricFamily(
        "conduit_work_ended_counts_age_seconds",
        "How old conduit_work's counts of ended Work (completed, failed, cancelled) are: they "
        "are read again once older than 100 times what their last read took",
        value=ended_seconds,
    )
    ready = GaugeMetricFamily(
        "conduit_work_ready",
        "Ready Work that could start now (has input, no backoff, hold or live attempt)",
        value=counts.get("startable", 0),
    )
    ready_by_binding = GaugeMetricFamily(
        "conduit_work_ready_depth",
        "Ready Work that could start now, per binding (from an index, not a scan)",
        labels=["binding", "pool"],
    )
    oldest = GaugeMetricFamily(
        "conduit_work_ready_oldest_age_seconds",
        "Age of the oldest Work that could start now, per binding (0 with none): how long it "
        "has been ready since its last change (submit, input, retry)",
        labels=["binding"],
    )
    pools_of = service.scheduler.options.binding_pools
    for binding in sorted({*service.config.bindings, *depth}):
        pool = pools_of.get(binding) or "global"
        count, since = summary.get(binding, (0, now_ms))
        ready_by_binding.add_metric([binding, pool], count)
        oldest.add_metric([binding], max(now_ms - since, 0) / 1000)
    by_kind: Counter[str] = Counter({"budget": 0, "gate": 0})
    by_kind.update(str(hold.kind) for hold, _ in held)
    by_kind["recovery"] = len(recoveries)
    holds = GaugeMetricFamily(
        "conduit_holds",
        "What waits for a person: budget and gate holds, held recoveries",
        labels=["kind"],
    )
    for kind, count in sorted(by_kind.items()):
        holds.add_metric([kind], count)
    attempts_held = GaugeMetricFamily(
        "conduit_attempts_held",
        "Attempts that keep their Work from starting again until settled: a held recovery "
        "(a person decides), or an ended attempt whose stop is not verified yet",
        labels=["reason"],
    )
    attempts_held.add_metric(["recovery"], len(recoveries))
    attempts_held.add_metric(["stop_unconfirmed"], len(unconfirmed))
    return [
        *pools, *scopes, keys_waiting, work, ended_age, ready, ready_by_binding, oldest, holds,
        attempts_held,
    ]


class _SlotRow(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def in_use(self) -> int: ...
    @property
    def limit(self) -> int | None: ...
    @property
    def waiting(self) -> int: ...


def _slot_families(kind: str, rows: Iterable[_SlotRow], in_use_help: str) -> list[Metric]:
    """In use, limit and waiting of each pool (or scope), as ``/v1/capacity`` reports them."""
    in_use = GaugeMetricFamily(f"conduit_{kind}_slots_in_use", in_use_help, labels=[kind])
    limit = GaugeMetricFamily(
        f"conduit_{kind}_slots_limit", f"The {kind}'s concurrency limit", labels=[kind]
    )
    waiting = GaugeMetricFamily(
        f"conduit_{kind}_waiting",
        f"Ready Work the daemon's last pass refused for the {kind}'s limit",
        labels=[kind],
    )
    for row in rows:
        in_use.add_metric([row.name], row.in_use)
        if row.limit is not None:
            limit.add_metric([row.name], row.limit)
        waiting.add_metric([row.name], row.waiting)
    return [in_use, limit, waiting]


class _Exposition:
    """One scrape's collectors: the process's instruments and the stored-state snapshot."""

    def __init__(self, metrics: Metrics, stored: Sequence[Metric], store_up: bool) -> None:
        self._metrics = metrics
        self._stored = stored
        self._store_up = store_up

    def collect(self) -> Iterable[Metric]:
        yield from self._metrics.registry.collect()
        yield GaugeMetricFamily(
            "conduit_store_up",
            "1 when the store answered this scrape's reads",
            value=1 if self._store_up else 0,
        )
        yield from self._stored


class MetricsEndpoint:
    """The ASGI app behind ``/metrics`` (``service`` is read per scrape: reload replaces it)."""

    def __init__(
        self,
        service: Callable[[], ApiService],
        token: str | TokenSet,
        *,
        open_access: bool = False,
        metrics: Metrics = METRICS,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self._service = service
        self._authorized = bearer_check(TokenSet.of(token))
        self._throttle = throttle
        self._open = open_access
        self._metrics = metrics
        self._ended = EndedCounts()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        throttle, address = self._throttle, client_address(scope)
        wait = throttle.retry_after(address) if throttle is not None and not self._open else None
        if wait is not None:
            await _send(send, 429, b'{"error":"too many wrong tokens from this address",'
                        b'"code":"login_throttled"}', "application/json",
                        retry_after=wait)  # fmt: skip
            return
        if not self._open and not self._authorized(headers):
            if throttle is not None and "authorization" in headers:
                log.warning("/metrics refused: wrong bearer token from %s", address)
                throttle.failed(address)
            await _send(send, 401, b'{"error":"missing or wrong bearer token","code":'
                        b'"unauthorized"}', "application/json")  # fmt: skip
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _send(send, 405, b'{"error":"method not allowed on /metrics (allowed: GET)",'
                        b'"code":"method_not_allowed"}', "application/json",
                        allow="GET")  # fmt: skip
            return
        stored: list[Metric] = []
        store_up = True
        try:
            stored = await stored_state_metrics(self._service(), self._ended)
        except ConduitError as exc:
            store_up = False
            log.debug("/metrics: stored-state gauges unavailable: [%s] %s", exc.code, exc.message)
        body = generate_latest(_Exposition(self._metrics, stored, store_up))
        await _send(send, 200, body if scope.get("method") == "GET" else b"", CONTENT_TYPE_LATEST)


async def _send(
    send: Send, status: int, body: bytes, content_type: str, *, allow: str | None = None,
    retry_after: int | None = None,
) -> None:  # fmt: skip
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    if allow is not None:
        headers.append((b"allow", allow.encode()))
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def with_metrics(app: ASGIApp, endpoint: MetricsEndpoint) -> ASGIApp:
    """``app`` with ``/metrics`` answered by ``endpoint`` (before the API's own token guard, so
    an open endpoint needs no token while every other path still does)."""

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == METRICS_PATH:
            await endpoint(scope, receive, send)
        else:
            await app(scope, receive, send)

    return dispatch
