"""After a PostgreSQL outage the store answers again as soon as the server does.

psycopg's pool reconnects on a backoff of its own (1, 2, 4, 8 s…), so after a 10 s outage its
next try came some 5 s after the server was back, and the daemon sat idle that long. The store
now checks, when its pool has no connection to give, whether the server answers, and renews the
pool if it does. Calls are made as the host loop makes them during an outage (its pause is at
most a second), and the first to succeed after the restart must come within a few seconds.
"""

from __future__ import annotations

import time

import pytest

from conduit_core.errors import StoreError
from conduit_core.storage import open_store
from tests.faults._pgserver import PrivateServer

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

OUTAGE_S = 10.0
#: The host loop's pause between passes while the store is down (``StoreOutage.max_s``).
PASS_PAUSE_S = 1.0
#: One pause, one pool wait (1 s) and the probe, with room for a loaded machine; the pool's
#: own backoff alone took 5 s after a 10 s outage.
BACK_WITHIN_S = 3.5


async def test_the_store_answers_within_seconds_of_the_server(
    private_pg: PrivateServer, private_pg_url: str
) -> None:
    async with await open_store(private_pg_url) as store:
        await store.work_counts()
        private_pg.stop()
        down_until = time.monotonic() + OUTAGE_S
        while time.monotonic() < down_until:  # the host loop's passes, failing meanwhile
            with pytest.raises(StoreError) as failed:
                await store.work_counts()
            assert failed.value.code in ("store_unavailable", "store_unreachable")
            time.sleep(PASS_PAUSE_S)  # noqa: ASYNC251 - the host loop's pause, not a wait for a result
        private_pg.start()
        back = time.monotonic()
        while True:
            try:
                await store.work_counts()
                break
            except StoreError:
                assert time.monotonic() - back < BACK_WITHIN_S, "the store stayed unreachable"
                time.sleep(PASS_PAUSE_S / 4)  # noqa: ASYNC251 - paced like the host loop
        assert time.monotonic() - back < BACK_WITHIN_S
