"""The embedded scheduler for code without an event loop: it runs in a thread of its own."""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from anyio.from_thread import BlockingPortal, start_blocking_portal

from conduit_core.client import BatchResult, Outcome, SubmitItem, WorkDetail
from conduit_core.config import Config
from conduit_core.embed._scheduler import EmbeddedScheduler

__all__ = ["Embedded"]

T = TypeVar("T")
R = TypeVar("R")


class Embedded:
    """``Embedded(config).start()`` runs the scheduler (the one ``conduit daemon`` runs) on an
    event loop in a background thread until :meth:`stop`; its calls block, as
    :class:`~conduit_core.client.Client`'s do. A ``with`` block starts and stops it. The
    arguments are :class:`EmbeddedScheduler`'s; ``backend`` is anyio's (``asyncio``, ``trio``).
    """

    def __init__(
        self, config: Config | str | os.PathLike[str], *, backend: str = "asyncio", **options: Any
    ) -> None:
        self.scheduler = EmbeddedScheduler(config, **options)
        self._backend = backend
        self._portal_cm: contextlib.AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._running: contextlib.AbstractContextManager[EmbeddedScheduler] | None = None

    def start(self) -> Embedded:
        """Start, and return once the host loop runs (recovery is under way)."""
        if self._portal is not None:
            return self
        self._portal_cm = start_blocking_portal(self._backend)
        portal = self._portal_cm.__enter__()
        try:
            running = portal.wrap_async_context_manager(self.scheduler)
            running.__enter__()
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            self._portal_cm = None
            raise
        self._portal, self._running = portal, running
        return self

    def stop(self) -> None:
        """Stop gracefully (running attempts handed over) and end the thread."""
        running, portal_cm = self._running, self._portal_cm
        self._running = self._portal = self._portal_cm = None
        try:
            if running is not None:
                running.__exit__(None, None, None)
        finally:
            if portal_cm is not None:
                portal_cm.__exit__(None, None, None)

    def __enter__(self) -> Embedded:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._portal is None:
            from conduit_core.client import ConduitClientError

            raise ConduitClientError("the embedded scheduler is not started", code="not_started")
        return self._portal.call(functools.partial(fn, *args, **kwargs))

    def submit(self, binding: str, input: Any = None, **fields: Any) -> WorkDetail:
        """As :meth:`conduit_core.client.Client.submit` (``scope``, ``kind``, ``id``,
        ``exist_ok``, ``priority``)."""
        detail: WorkDetail = self._call(self.scheduler.submit, binding, input, **fields)
        return detail

    def submit_many(self, items: Iterable[SubmitItem]) -> BatchResult:
        result: BatchResult = self._call(self.scheduler.submit_many, builtins.list(items))
        return result

    def get(self, work_id: str) -> WorkDetail:
        detail: WorkDetail = self._call(self.scheduler.get, work_id)
        return detail

    @overload
    def wait(
        self, work_id: str, *, timeout: float | None = ..., data_type: None = ...
    ) -> Outcome[dict[str, Any]]: ...

    @overload
    def wait(
        self, work_id: str, *, timeout: float | None = ..., data_type: type[T]
    ) -> Outcome[T]: ...

    def wait(
        self, work_id: str, *, timeout: float | None = 60.0, data_type: type[Any] | None = None
    ) -> Outcome[Any]:
        result: Outcome[Any] = self._call(
            self.scheduler.wait, work_id, timeout=timeout, data_type=data_type
        )
        return result

    def cancel(self, work_id: str, reason: str = "") -> WorkDetail:
        detail: WorkDetail = self._call(self.scheduler.cancel, work_id, reason)
        return detail

    def retry(self, work_id: str, reason: str = "") -> WorkDetail:
        detail: WorkDetail = self._call(self.scheduler.retry, work_id, reason)
        return detail
