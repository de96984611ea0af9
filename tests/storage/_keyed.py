"""Helpers of the concurrency-key tests (``test_keys_priorities``, ``test_key_parking``)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import anyio
import msgspec

from conduit_core.model import Work
from conduit_core.storage.conformance import T0, make_work

T = TypeVar("T")


def keyed_work(
    work_id: str, key: str | None, limit: int = 1, *, at: int = T0, priority: int = 0
) -> Work:
    """A standing Work with concurrency key ``key`` (``None``: none) and ``key_limit``, ready
    (and created) at ``at``."""
    return msgspec.structs.replace(
        make_work(work_id), concurrency_key=key, key_limit=limit, updated_at_ms=at,
        created_at_ms=at, priority=priority,
    )  # fmt: skip


async def in_transaction(store: Any, fn: Callable[[Any], T]) -> T:
    """``fn(cx)`` in a write transaction of ``store`` (a SQL store), off the event loop."""
    return await anyio.to_thread.run_sync(partial(store.transaction, fn))


async def parked_ids(store: Any) -> list[str]:
    """The ids of the parked ready Work (``key_parked``: out of the claim's read), sorted."""
    rows = await in_transaction(store, lambda cx: cx.rows(
        "SELECT id FROM conduit_work WHERE key_parked = 1 AND claimable = 1 ORDER BY id"))  # fmt: skip
    return [str(row[0]) for row in rows]
