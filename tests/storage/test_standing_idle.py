"""Standing Work is claimable only with pending input (issue 17 item 15), on both stores."""

from __future__ import annotations

import msgspec
import pytest

from conduit_core.model import ExecutionStatus, Work, WorkKind, WorkStatus
from conduit_core.storage import (
    AttemptEnd,
    Claim,
    ClaimRequest,
    NotEligibleError,
    Store,
    open_store,
)
from conduit_core.storage._sqlstore import SqlStore
from conduit_core.storage.conformance import make_input, make_work, snapshot

pytestmark = pytest.mark.anyio

T0 = 1_000_000


async def _ready_claims(store: Store, now: int) -> list[Claim]:
    outcomes = await store.claim_ready(
        limit=10, snapshot_for=lambda w: snapshot(), owner="o", now_ms=now, lease_ms=10_000
    )
    return [o for o in outcomes if isinstance(o, Claim)]


async def test_standing_work_idles_until_its_next_input(store_url: str) -> None:
    async with await open_store(store_url) as store:
        await store.create_work(make_work("quiet", kind=WorkKind.STANDING))  # no input at all
        await store.create_work(make_work("s", kind=WorkKind.STANDING), first_input=make_input("1"))
        (claim,) = await _ready_claims(store, T0)  # only the one with input
        assert claim.execution.work_id == "s"
        with pytest.raises(NotEligibleError, match="no pending input"):
            await store.claim_attempt(claim_request("quiet"), owner="o", now_ms=T0, lease_ms=10_000)
        end = AttemptEnd(status=ExecutionStatus.COMPLETED, exclusion_confirmed=True)
        await store.finish_attempt(claim.lease, end, now_ms=T0 + 1, work=_ready)
        assert (await store.get_work("s")).status is WorkStatus.READY  # idle
        assert await _ready_claims(store, T0 + 2) == []  # it did not start again by itself
        await store.accept_event(make_input("2", "s"))
        (again,) = await _ready_claims(store, T0 + 3)
        assert (again.execution.work_id, again.execution.attempt) == ("s", 2)


async def test_a_row_claimable_under_the_old_rule_is_healed_not_run(store_url: str) -> None:
    async with await open_store(store_url) as store:
        assert isinstance(store, SqlStore)
        await store.create_work(make_work("old", kind=WorkKind.STANDING))
        # As a store written by an older conduit holds it: idle standing Work marked claimable.
        await store._write(
            lambda cx: cx.run("UPDATE conduit_work SET claimable = 1 WHERE id = ?", ("old",))
        )
        assert [w.id for w in await store.ready_work(limit=10)] == ["old"]
        assert await _ready_claims(store, T0) == []
        assert await store.ready_work(limit=10) == []  # the column was rewritten


def claim_request(work_id: str) -> ClaimRequest:
    return ClaimRequest(work_id=work_id, snapshot=snapshot())


def _ready(work: Work) -> Work:
    return msgspec.structs.replace(work, status=WorkStatus.READY)
