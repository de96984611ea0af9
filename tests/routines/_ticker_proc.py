"""A ticker in its own process, for the multi-process tests.

``python -m tests.routines._ticker_proc race URL OWNER SECONDS``: tick for SECONDS on the real
clock; each fire's Work is completed at once (so a Routine fires again next occurrence); prints
one JSON line per fire: ``{"owner", "work_id", "created"}``.

``python -m tests.routines._ticker_proc die URL OWNER``: tick once; the fire creates its Work
and the process SIGKILLs itself before recording the fire (claim lease 300 ms).

``python -m tests.routines._ticker_proc die-ahead URL OWNER``: tick with a 10 s claim-ahead; the
process SIGKILLs itself as soon as a claim committed, before the claimed row's instant (claim
lease 300 ms).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import anyio
import msgspec

from conduit_core.errors import ConduitError
from conduit_core.model import Event, Routine, Work, WorkStatus
from conduit_core.routines import Ticker
from conduit_core.runtime import SystemClock
from conduit_core.storage import Claim, Store, open_store


class CompletingTarget:
    def __init__(self, store: Store, owner: str, *, die: bool = False) -> None:
        self.store, self.owner, self.die = store, owner, die

    async def submit(self, work: Work, first_input: Event | None = None) -> Work:
        created = True
        try:
            stored = await self.store.create_work(work, first_input=first_input)
        except ConduitError as exc:
            if exc.code != "work_exists":
                raise
            created = False
            stored = await self.store.get_work(work.id)
        if self.die:
            os.kill(os.getpid(), signal.SIGKILL)
        print(json.dumps({"owner": self.owner, "work_id": work.id, "created": created}), flush=True)
        now = SystemClock().now_ms()
        await self.store.update_work(
            work.id, lambda w: msgspec.structs.replace(w, status=WorkStatus.COMPLETED), now_ms=now
        )
        if not created:
            raise ConduitError(f"work {work.id!r} already exists", code="work_exists")
        return stored

    async def accept_input(self, event: Event) -> tuple[Event, list[Claim]]:
        return await self.store.accept_event(event), []


async def main(mode: str, url: str, owner: str, seconds: float) -> None:
    async with await open_store(url) as store:
        target = CompletingTarget(store, owner, die=mode == "die")
        if mode == "die-ahead":
            claim_queued = store.claim_queued

            async def claim_then_die(*args: Any, **kwargs: Any) -> list[Routine]:
                won = await claim_queued(*args, **kwargs)
                if won:
                    os.kill(os.getpid(), signal.SIGKILL)
                return won

            store.claim_queued = claim_then_die  # type: ignore[method-assign]
            ticker = Ticker(store, target, SystemClock(), owner=owner, lease_ms=300,
                            claim_ahead_ms=10_000)  # fmt: skip
            with anyio.move_on_after(30):
                await ticker.run()
            return
        lease = 300 if mode == "die" else 60_000
        ticker = Ticker(store, target, SystemClock(), owner=owner, lease_ms=lease,
                        running_recheck_ms=50)  # fmt: skip
        if mode == "die":
            await ticker.tick()
            return
        print(json.dumps({"owner": owner, "ready": True}), flush=True)
        with anyio.move_on_after(seconds):
            await ticker.run()


if __name__ == "__main__":
    mode, url, owner = sys.argv[1:4]
    anyio.run(main, mode, url, owner, float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
