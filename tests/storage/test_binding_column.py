"""The Work's binding as a column (schema V6): filled in for Work a V5 store already had, and
what a claim from the ready queue filters on (only bindings whose pool has a free slot)."""

from __future__ import annotations

import sqlite3

import msgspec
import psycopg
import pytest

from conduit_core.storage import CapacityLimits, Claim, open_store
from conduit_core.storage.conformance import T0, make_input, make_work, snapshot
from tests.storage._undo import UNDO_V20

pytestmark = pytest.mark.anyio

#: What the Work-search migration (V8) added, undone: first, so V6 can be undone too.
UNDO_SEARCH = (
    "DROP INDEX conduit_work_created",
    "DROP INDEX conduit_work_status_created",
    "DROP INDEX conduit_work_scope_created",
    "DROP INDEX conduit_work_binding_created",
    "ALTER TABLE conduit_work DROP COLUMN created_at_ms",
    "ALTER TABLE conduit_work DROP COLUMN first_input",
    "UPDATE conduit_work SET status = 'ready' WHERE status = 'exhausted'",
    "CREATE INDEX conduit_work_status ON conduit_work (status, id)",
    "CREATE INDEX conduit_work_scope ON conduit_work (scope, id)",
)

#: What V6 added (and the later migrations that touch the same tables), undone: the store then
#: looks like one a V5 conduit left. The tables later migrations create are created ``IF NOT
#: EXISTS``, so they stay.
UNDO_V6 = (
    # Fewer dead rows per job (issue 32): the inputs' partial index, the lease table.
    "DROP INDEX conduit_event_work",
    "ALTER TABLE conduit_work DROP COLUMN input_floor",
    "CREATE INDEX conduit_event_pending ON conduit_event (work_id, seq) WHERE pending = 1",
    "DROP INDEX conduit_execution_lease_expiry",
    *(
        f"ALTER TABLE conduit_execution DROP COLUMN lease_{column}"
        for column in ("owner", "token", "expires_at_ms", "duration_ms", "released")
    ),
    """CREATE TABLE conduit_lease (
        execution_id TEXT PRIMARY KEY, work_id TEXT NOT NULL, epoch INTEGER NOT NULL,
        owner TEXT NOT NULL, token TEXT NOT NULL, expires_at_ms BIGINT NOT NULL,
        duration_ms BIGINT NOT NULL, released INTEGER NOT NULL)""",
    "CREATE INDEX conduit_lease_expiry ON conduit_lease (expires_at_ms)",
    # Dedup key release: the key table stays (``IF NOT EXISTS``), its later column goes.
    "ALTER TABLE conduit_submit_key DROP COLUMN expires_at_ms",
    *UNDO_V20,
    # Parked Work of a key at its limit (V19), then concurrency keys (issue 36).
    "DROP INDEX conduit_work_ready_order",  # V17 (SQLite), V18 (PostgreSQL), V19
    "DROP INDEX conduit_work_key_ready",
    "DROP INDEX conduit_work_key_parked",
    "ALTER TABLE conduit_work DROP COLUMN key_parked",
    "DROP INDEX conduit_execution_key",
    "ALTER TABLE conduit_execution DROP COLUMN concurrency_key",
    "ALTER TABLE conduit_work DROP COLUMN concurrency_key",
    "ALTER TABLE conduit_work DROP COLUMN key_limit",
    *UNDO_SEARCH,
    "DROP INDEX conduit_work_ready_binding",
    "ALTER TABLE conduit_work DROP COLUMN binding",
)


def _downgrade_to_v5(store_url: str) -> None:
    if store_url.startswith("sqlite://"):
        with sqlite3.connect(store_url.removeprefix("sqlite://")) as conn:
            for statement in UNDO_V6:
                conn.execute(statement)
            conn.execute("UPDATE conduit_meta SET value = '5' WHERE key = 'schema_version'")
        return
    with psycopg.connect(store_url, autocommit=True) as conn:
        for statement in UNDO_V6:
            conn.execute(statement)
        conn.execute("UPDATE conduit_meta SET value = '5' WHERE key = 'schema_version'")


async def test_the_upgrade_fills_in_the_binding_of_existing_work(store_url: str) -> None:
    async with await open_store(store_url) as store:
        for i, binding in enumerate(["full", "full", "open"]):
            work = msgspec.structs.replace(make_work(f"w{i}"), binding=binding)
            await store.create_work(work, first_input=make_input(f"w{i}-in"))
    _downgrade_to_v5(store_url)
    async with await open_store(store_url) as store:  # migrates V5 -> current
        # Pool "p" of binding "full" is full (its limit is 0): only "open"'s Work is read.
        limits = CapacityLimits(
            global_limit=8, pool_limits={"p": 0}, binding_pools={"full": "p", "open": None}
        )
        claims = await store.claim_ready(
            limit=8, snapshot_for=lambda work: snapshot(), owner="o", now_ms=T0,
            lease_ms=30_000, capacity=limits,
        )  # fmt: skip
        assert [c.work.id for c in claims if isinstance(c, Claim)] == ["w2"]
        assert [c for c in claims if not isinstance(c, Claim)] == []
