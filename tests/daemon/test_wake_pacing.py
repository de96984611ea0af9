"""PostgreSQL: a busy daemon's wake NOTIFYs are paced, and none is lost.

The host asks for a NOTIFY after every write and every ended attempt. Sent as fast as round
trips allowed, that was hundreds a second under load, each a transaction for the server and a
wake-up for every listening daemon. The sender now sends at most one per ``NOTIFY_INTERVAL_S``;
a request made meanwhile is sent at the interval's end, so the last write is always announced.
Here a real channel is asked a thousand times within about half a second, and a plain
``LISTEN`` connection counts what the server delivered.
"""

from __future__ import annotations

import time

import anyio
import psycopg
import pytest

from conduit_core.daemon._wake import NOTIFY_INTERVAL_S, WAKE_CHANNEL, PgWakeChannel, Waker

pytestmark = pytest.mark.anyio

ASKS = 1000


class _Heard:
    """When each NOTIFY of one sender arrived, with an event set at each arrival."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.arrived = anyio.Event()

    async def listen(self, conn: psycopg.AsyncConnection, owner: str) -> None:
        async for note in conn.notifies():
            if note.payload == owner:
                self.times.append(time.monotonic())
                self.arrived.set()
                self.arrived = anyio.Event()


async def test_a_burst_of_wake_requests_sends_paced_notifies_and_announces_the_last(
    postgres_url: str,
) -> None:
    heard = _Heard()
    listener = await psycopg.AsyncConnection.connect(postgres_url, autocommit=True)
    async with listener:
        await listener.execute(f"LISTEN {WAKE_CHANNEL}")
        channel = PgWakeChannel(postgres_url, Waker(), owner="busy-daemon")
        async with anyio.create_task_group() as tg:
            tg.start_soon(heard.listen, listener, "busy-daemon")
            await tg.start(channel.run)
            began = time.monotonic()
            for i in range(ASKS):
                channel.notify()
                if i % 10 == 0:
                    await anyio.sleep(0.005)
            last_ask = time.monotonic()
            # None lost: a NOTIFY comes after the last request (at the latest one interval on).
            with anyio.fail_after(10):
                while not heard.times or heard.times[-1] < last_ask:
                    await heard.arrived.wait()
            spell = heard.times[-1] - began
            tg.cancel_scope.cancel()
    # One at once, then at most one per interval (two of slack for the scheduling of the test).
    most = 1 + spell / NOTIFY_INTERVAL_S + 2
    sent = len(heard.times)
    assert sent <= most, f"{sent} NOTIFYs for {ASKS} requests over {spell:.3f} s"
    assert sent >= 2


async def test_a_ready_only_write_makes_other_daemons_claim_and_any_other_makes_them_pass(
    postgres_url: str,
) -> None:
    """A submit or a freed slot only needs other daemons to claim: its NOTIFY says ``ready``
    and their channel calls ``on_ready`` (the host's claim) instead of waking a whole pass. A
    write of another kind in the same interval makes the NOTIFY a plain one: a pass."""
    claims = 0
    claimed = anyio.Event()

    def on_ready() -> None:
        nonlocal claims
        claims += 1
        claimed.set()

    listener_waker = Waker()
    sender = PgWakeChannel(postgres_url, Waker(), owner="daemon-a")
    listener = PgWakeChannel(postgres_url, listener_waker, owner="daemon-b", on_ready=on_ready)
    async with anyio.create_task_group() as tg:
        await tg.start(sender.run)
        await tg.start(listener.run)
        assert await listener_waker.wait(0)  # its own "listening again: rescan" poke, taken
        sender.notify_ready()
        with anyio.fail_after(10):
            await claimed.wait()
        # That NOTIFY was heard (a claim) and it woke no pass.
        assert claims == 1
        assert not await listener_waker.wait(0)
        sender.notify_ready()
        sender.notify()  # in the same interval: one NOTIFY, and it needs a pass
        assert await listener_waker.wait(10)
        tg.cancel_scope.cancel()
    assert claims == 1
