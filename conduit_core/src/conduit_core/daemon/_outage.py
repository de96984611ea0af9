"""A store outage as the daemon sees it: one log line when it starts, one when it ends, and a
growing pause between passes while it lasts.

Every pass step, lease renewal and API call fails while a PostgreSQL server restarts or is
unreachable. Logging each failure would print a line per step per pass; retrying at the rescan
pace would hammer a server that is coming back. So the host loop reports outage errors here:
the first one logs ``store unavailable …``, the next ones only count, the pause between passes
doubles (with jitter, never past ``max_s``), and the first clean pass logs ``store available
again``. ``max_s`` is 1 s: one connection attempt a second costs a server that is coming back
nothing, and the daemon is back at work within a second of the store answering (a 10 s cap
left it idle for up to 10 s after a restart).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from conduit_core.errors import STORE_OUTAGE_CODES, ConduitError, is_store_outage

__all__ = ["OUTAGE_CODES", "StoreOutage", "is_outage"]

log = logging.getLogger("conduit.daemon")

OUTAGE_CODES = STORE_OUTAGE_CODES


is_outage = is_store_outage


class StoreOutage:
    """Whether the store is down (as last seen) and how long to pause before the next try."""

    def __init__(
        self,
        *,
        base_s: float = 0.25,
        max_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_s = base_s
        self.max_s = max_s
        self._monotonic = monotonic
        self.since: float | None = None
        self.failures = 0
        self.outages = 0
        self._pauses = 0

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, where: str, exc: ConduitError) -> None:
        self.failures += 1
        if self.since is not None:
            log.debug("store still unavailable (%s): %s", where, exc.message)
            return
        self.since = self._monotonic()
        self.outages += 1
        log.warning(
            "store unavailable (%s: [%s] %s); retrying with backoff up to %g s",
            where, exc.code, exc.message, self.max_s,
        )  # fmt: skip

    def recovered(self) -> None:
        if self.since is None:
            return
        log.warning(
            "store available again after %.1f s (%d failed tries)",
            self._monotonic() - self.since, self.failures,
        )  # fmt: skip
        self.since = None
        self.failures = 0
        self._pauses = 0

    def pause_s(self, normal_s: float) -> float:
        """The pause before the next pass: ``normal_s``, or the backoff while the store is down."""
        if self.since is None:
            return normal_s
        backoff: float = self.base_s * 2.0 ** min(self._pauses, 16)
        self._pauses += 1
        return max(normal_s, min(self.max_s, backoff * random.uniform(0.75, 1.25)))
