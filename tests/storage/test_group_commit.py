"""Group commit: concurrent writes share transactions without sharing their failures."""

from __future__ import annotations

import anyio
import pytest

from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.model import Event, Work
from conduit_core.storage import Store, _sqlstore, open_store

pytestmark = pytest.mark.anyio


def _work(i: int) -> Work:
    return Work(id=f"g{i}", scope="root", binding="b", created_at_ms=1, updated_at_ms=1)


async def test_one_refused_write_does_not_undo_its_batch_neighbours(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    original = _sqlstore.SqlStore._run_batch

    def counting(self: _sqlstore.SqlStore, ops: list) -> None:  # type: ignore[type-arg]
        sizes.append(len(ops))
        original(self, ops)

    monkeypatch.setattr(_sqlstore.SqlStore, "_run_batch", counting)
    store: Store
    async with await open_store(store_url) as store:
        outcomes: dict[int, object] = {}

        async def write(i: int) -> None:
            try:
                if i % 5 == 0:  # input for Work that does not exist: refused
                    ev = Event(id=f"x{i}", delivery_id=f"x{i}", type="t", work_id="nope",
                               pending=True, accepted_at_ms=1)  # fmt: skip
                    outcomes[i] = await store.accept_event(ev)
                else:
                    outcomes[i] = await store.create_work(_work(i))
            except ConduitError as exc:
                outcomes[i] = exc

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(write, i)
        assert max(sizes) > 1, "concurrent writes should have shared a transaction"
        for i in range(40):
            if i % 5 == 0:
                assert isinstance(outcomes[i], NotFoundError)
            else:
                assert (await store.get_work(f"g{i}")).id == f"g{i}"
        # Nothing of the refused writes was kept.
        with pytest.raises(NotFoundError):
            await store.get_event("x0")


async def test_a_cancelled_caller_whose_write_never_ran_leaves_nothing(store_url: str) -> None:
    async with await open_store(store_url) as store:
        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(store.create_work, _work(i))
            tg.cancel_scope.cancel()
        # Whatever ran committed whole; what did not run left no trace; the store still works.
        stored = {w.id for w in await store.list_work(limit=100)}
        assert stored <= {f"g{i}" for i in range(20)}
        await store.create_work(_work(99))
        assert (await store.get_work("g99")).id == "g99"
