"""Keeps the store's query-planner statistics up with a young store (``Store.refresh_statistics``).

A task of its own, never a step of the pass: an ANALYZE of a large table takes tens of
milliseconds, and nothing on the pass may wait on it.
"""

from __future__ import annotations

import logging

import anyio
from anyio.abc import TaskStatus

from conduit_core.errors import ConduitError
from conduit_core.storage import Store

__all__ = ["StatisticsUpkeep"]

log = logging.getLogger("conduit.daemon")

#: Seconds between two looks (one read of the server's table statistics each).
EVERY_S = 2.0


class StatisticsUpkeep:
    def __init__(self, store: Store, every_s: float = EVERY_S) -> None:
        self.store = store
        self.every_s = every_s

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await anyio.sleep(self.every_s)
            try:
                tables = await self.store.refresh_statistics()
            except ConduitError as exc:  # an outage is reported by the passes
                log.debug("planner statistics not refreshed: [%s] %s", exc.code, exc.message)
                continue
            except Exception:
                log.exception("planner statistics not refreshed")
                continue
            if tables:
                log.info("planner statistics refreshed: %s", ", ".join(tables))
