"""The store's tables, shared by SQLite and PostgreSQL, and its forward migrations.

Each table keeps the columns that are queried or indexed, plus the record itself as msgspec JSON
in ``data``. Flags are INTEGER 0/1 on both backends so the same SQL runs on each.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "STORE_KIND", "TABLES", "PerBackend"]

#: Written to ``conduit_meta`` so a conduit store is told apart from a foreign database.
STORE_KIND = "conduit"

_V1 = (
    "CREATE TABLE conduit_counter (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
    """CREATE TABLE conduit_work (
        id TEXT PRIMARY KEY, status TEXT NOT NULL, scope TEXT NOT NULL,
        claimable INTEGER NOT NULL, ready_since BIGINT NOT NULL, data TEXT NOT NULL)""",
    # Only startable Work is in this index, so a million finished rows cost nothing to claims.
    "CREATE INDEX conduit_work_claimable ON conduit_work (ready_since, id) WHERE claimable = 1",
    "CREATE INDEX conduit_work_status ON conduit_work (status, id)",
    "CREATE INDEX conduit_work_scope ON conduit_work (scope, id)",
    """CREATE TABLE conduit_event (
        id TEXT PRIMARY KEY, delivery_id TEXT NOT NULL UNIQUE, seq BIGINT NOT NULL,
        work_id TEXT, pending INTEGER NOT NULL, data TEXT NOT NULL)""",
    "CREATE INDEX conduit_event_pending ON conduit_event (work_id, seq) WHERE pending = 1",
    """CREATE TABLE conduit_execution (
        id TEXT PRIMARY KEY, work_id TEXT NOT NULL, attempt INTEGER NOT NULL,
        epoch INTEGER NOT NULL, status TEXT NOT NULL, live INTEGER NOT NULL,
        holds_slot INTEGER NOT NULL, pool TEXT, scope TEXT NOT NULL, data TEXT NOT NULL,
        UNIQUE (work_id, attempt))""",
    # Invariant 1 enforced by the database itself: one live attempt per Work.
    "CREATE UNIQUE INDEX conduit_execution_one_live ON conduit_execution (work_id) WHERE live = 1",
    # The capacity check reads only slot holders: live and unconfirmed-exclusion attempts.
    "CREATE INDEX conduit_execution_slot ON conduit_execution (pool, scope) WHERE holds_slot = 1",
    """CREATE TABLE conduit_lease (
        execution_id TEXT PRIMARY KEY, work_id TEXT NOT NULL, epoch INTEGER NOT NULL,
        owner TEXT NOT NULL, token TEXT NOT NULL, expires_at_ms BIGINT NOT NULL,
        duration_ms BIGINT NOT NULL, released INTEGER NOT NULL)""",
    "CREATE INDEX conduit_lease_expiry ON conduit_lease (expires_at_ms)",
    """CREATE TABLE conduit_timer (
        id TEXT PRIMARY KEY, due_at_ms BIGINT NOT NULL, work_id TEXT, data TEXT NOT NULL)""",
    "CREATE INDEX conduit_timer_due ON conduit_timer (due_at_ms, id)",
    "CREATE INDEX conduit_timer_work ON conduit_timer (work_id)",
    """CREATE TABLE conduit_hold (
        work_id TEXT NOT NULL, kind TEXT NOT NULL, holder TEXT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (work_id, kind, holder))""",
    """CREATE TABLE conduit_wait (
        execution_id TEXT PRIMARY KEY, work_id TEXT NOT NULL, event_type TEXT,
        correlation_key TEXT, data TEXT NOT NULL)""",
    "CREATE INDEX conduit_wait_work ON conduit_wait (work_id)",
    """CREATE TABLE conduit_control (
        id TEXT PRIMARY KEY, status TEXT NOT NULL, created_at_ms BIGINT NOT NULL,
        open INTEGER NOT NULL, data TEXT NOT NULL)""",
    "CREATE INDEX conduit_control_open ON conduit_control (created_at_ms, id) WHERE open = 1",
    "CREATE TABLE conduit_budget_ledger (key TEXT PRIMARY KEY, data TEXT NOT NULL)",
    """CREATE TABLE conduit_config_generation (
        generation BIGINT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, data TEXT NOT NULL)""",
    """CREATE TABLE conduit_routine (
        id TEXT PRIMARY KEY, status TEXT NOT NULL, next_run_at_ms BIGINT, data TEXT NOT NULL)""",
    "CREATE INDEX conduit_routine_due ON conduit_routine (next_run_at_ms) WHERE status = 'idle'",
)

# Routines: the ticker's queued/claimed/running scans and the per-Routine run history.
_V2 = (
    "CREATE INDEX conduit_routine_status ON conduit_routine (status, next_run_at_ms)",
    """CREATE TABLE conduit_routine_run (
        routine_id TEXT NOT NULL, scheduled_for_ms BIGINT NOT NULL, work_id TEXT,
        outcome TEXT NOT NULL, started_at_ms BIGINT NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (routine_id, scheduled_for_ms))""",
)

# Budgets: usage staged by attempt-state writes, charged to the ledgers at the next start.
_V3 = (
    """CREATE TABLE conduit_budget_pending (
        id TEXT PRIMARY KEY, work_id TEXT NOT NULL, data TEXT NOT NULL)""",
)

# The attempt row's revision: bumped by every write of the row and by every lease write except a
# renewal, so a writer that knows the revision it last saw can write in one fenced statement
# (see ``_ops_attempts.update_attempt``: the known-revision fast path).
_V4 = ("ALTER TABLE conduit_execution ADD COLUMN rev BIGINT NOT NULL DEFAULT 0",)


class PerBackend(NamedTuple):
    """A migration statement that differs by backend (``None``: nothing to do there)."""

    sqlite: str | None
    postgres: str | None


# Event sequence numbers from a sequence where the backend has one: ``nextval`` takes no row
# lock, so concurrent submitters no longer queue on the ``event_seq`` counter row until commit.
# It starts after the counter's last number; SQLite (one writer) keeps the counter row.
_V5 = (
    PerBackend(None, "CREATE SEQUENCE conduit_event_seq"),
    PerBackend(
        None,
        "SELECT setval('conduit_event_seq', (SELECT COALESCE(MAX(value), 0) + 1 "
        "FROM conduit_counter WHERE name = 'event_seq'), false)",
    ),
)

# The Work's binding as a column: a claim reads only the ready Work of bindings whose pool has a
# free slot, and the "waiting for" counts and ready depth per binding come from this partial
# index instead of decoding every ready row (see ``_ready_reads.capacity_sized``).
_V6 = (
    "ALTER TABLE conduit_work ADD COLUMN binding TEXT NOT NULL DEFAULT ''",
    PerBackend(
        "UPDATE conduit_work SET binding = json_extract(data, '$.binding')",
        "UPDATE conduit_work SET binding = (data::jsonb) ->> 'binding'",
    ),
    "CREATE INDEX conduit_work_ready_binding ON conduit_work (binding, scope) WHERE claimable = 1",
)

# Room on each page of the attempt table for an updated row version: an attempt's writes that
# change no indexed column (its launch intent, its recovery metadata) become heap-only (HOT)
# updates, whose old versions are pruned in place, not left for autovacuum and the indexes.
# Applies to pages written from now on (SQLite has no such setting).
_V7 = (PerBackend(None, "ALTER TABLE conduit_execution SET (fillfactor = 70)"),)

# Work search (the console and ``GET /v1/work``): newest first by created time with keyset pages.
# ``created_at_ms`` and ``first_input`` (the first input's top-level scalars, for ``input.KEY``)
# are columns written once at insert; ``status`` holds the listed state, ``exhausted`` for ready
# Work blocked until a person's retry. Each filter has an index ending in (created_at_ms, id), so
# a page is one index range read whatever its depth; the two (status|scope, id) indexes they
# replace served only the old id-ordered listing.
_V8 = (
    "ALTER TABLE conduit_work ADD COLUMN created_at_ms BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE conduit_work ADD COLUMN first_input TEXT",
    PerBackend(
        "UPDATE conduit_work SET created_at_ms = json_extract(data, '$.created_at_ms')",
        "UPDATE conduit_work SET created_at_ms = ((data::jsonb) ->> 'created_at_ms')::bigint",
    ),
    PerBackend(
        "UPDATE conduit_work SET status = 'exhausted' WHERE status = 'ready' "
        "AND json_extract(data, '$.blocked_reason') IS NOT NULL",
        "UPDATE conduit_work SET status = 'exhausted' WHERE status = 'ready' "
        "AND (data::jsonb) ->> 'blocked_reason' IS NOT NULL",
    ),
    PerBackend(
        "UPDATE conduit_work SET first_input = f.payload FROM ("
        "SELECT work_id, json_extract(data, '$.payload') AS payload, MIN(seq) FROM conduit_event "
        "WHERE work_id IS NOT NULL GROUP BY work_id) AS f "
        "WHERE f.work_id = conduit_work.id AND json_type(f.payload) = 'object'",
        "UPDATE conduit_work SET first_input = f.payload::text FROM ("
        "SELECT DISTINCT ON (work_id) work_id, (data::jsonb) -> 'payload' AS payload "
        "FROM conduit_event WHERE work_id IS NOT NULL ORDER BY work_id, seq) AS f "
        "WHERE f.work_id = conduit_work.id AND jsonb_typeof(f.payload) = 'object'",
    ),
    "DROP INDEX conduit_work_status",
    "DROP INDEX conduit_work_scope",
    "CREATE INDEX conduit_work_created ON conduit_work (created_at_ms, id)",
    "CREATE INDEX conduit_work_status_created ON conduit_work (status, created_at_ms, id)",
    "CREATE INDEX conduit_work_scope_created ON conduit_work (scope, created_at_ms, id)",
    "CREATE INDEX conduit_work_binding_created ON conduit_work (binding, created_at_ms, id)",
)

# Host labels and drain: the daemon registry (``conduit daemons``), one row per daemon start,
# written at its start, on its heartbeat and at its exit.
_V9 = (
    """CREATE TABLE IF NOT EXISTS conduit_daemon (
        id TEXT PRIMARY KEY, last_seen BIGINT NOT NULL, data TEXT NOT NULL)""",
)

# Concurrency keys and priorities (issue 36): the Work's rendered key and its limit, and the
# attempt's key, counted by the claim over a partial index of the attempts holding a slot.
# Priorities need no column: they are folded into ``ready_since`` (``_sql.ready_rank``).
_V10 = (
    "ALTER TABLE conduit_work ADD COLUMN concurrency_key TEXT",
    "ALTER TABLE conduit_work ADD COLUMN key_limit INTEGER NOT NULL DEFAULT 1",
    "ALTER TABLE conduit_execution ADD COLUMN concurrency_key TEXT",
    "CREATE INDEX conduit_execution_key ON conduit_execution (concurrency_key) "
    "WHERE holds_slot = 1 AND concurrency_key IS NOT NULL",
)

# Dependencies between Work (``after``): one row per dependency a Work still waits for, found
# by the dependency when it ends (``_dependents.settle_dependents``), deleted then. ``IF NOT
# EXISTS``: a store whose version was set back (a test that undoes an earlier step) takes it again.
_V11 = (
    """CREATE TABLE IF NOT EXISTS conduit_dependency (
        work_id TEXT NOT NULL, depends_on TEXT NOT NULL, PRIMARY KEY (work_id, depends_on))""",
    "CREATE INDEX IF NOT EXISTS conduit_dependency_on ON conduit_dependency (depends_on)",
)

# Dedup and debounce (docs/dedup.md): one row per (kind, binding, key) naming the Work that holds
# the key. A submit with a key inserts it or locks it in its own transaction, so two submitters
# racing on any number of daemons decide one after the other on the row, never both "new".
_V12 = (
    """CREATE TABLE IF NOT EXISTS conduit_submit_key (
        kind TEXT NOT NULL, binding TEXT NOT NULL, submit_key TEXT NOT NULL,
        work_id TEXT NOT NULL, PRIMARY KEY (kind, binding, submit_key))""",
)

# Dedup key release: a key row's window end (``holder created + window`` for a window key, 0
# for a key without one), so a sweep can delete rows that name nothing any more
# (``Store.release_submit_keys``). NULL: written before this migration (kept).
_V13 = ("ALTER TABLE conduit_submit_key ADD COLUMN expires_at_ms BIGINT",)

# Fewer dead rows per job (issue 32). An input consumed by a claim changes only its ``pending``
# flag and document: with the inputs indexed by (work_id, seq) whatever their flag, instead of a
# partial index over the pending ones, that write touches no indexed column and, with room left
# on the page (``fillfactor``), is heap-only (HOT): pruned in place, no index entry, no work for
# autovacuum. Every read of the inputs names their Work (or their id), so the index serves them.
_V14 = (
    "DROP INDEX conduit_event_pending",
    "CREATE INDEX conduit_event_work ON conduit_event (work_id, seq) WHERE work_id IS NOT NULL",
    PerBackend(None, "ALTER TABLE conduit_event SET (fillfactor = 70)"),
    # Room on each page of the attempt table for both in-flight writes of every attempt on it
    # (the launch intent, then the recovery metadata, ~1.2 KB each): at 70 % a page's ~5 new
    # attempts found room for about half of them heap-only unless PostgreSQL could prune first;
    # at 40 % most are (non-heap-only dead versions per job on the table 1.56-1.69 -> 1.13-1.19,
    # bench_daemon at 300 jobs/s). The cost: the table's pages stay ~40-50 % full.
    PerBackend(None, "ALTER TABLE conduit_execution SET (fillfactor = 40)"),
    # What keeps a Work's pending reads short now that the index holds its consumed inputs too:
    # every input of the Work numbered up to ``input_floor`` is no longer pending. A claim sets it
    # to the last input it consumed (it consumes the oldest pending ones, and a Work's inputs are
    # numbered under its lock, so none below can commit later); a read starts above it.
    "ALTER TABLE conduit_work ADD COLUMN input_floor BIGINT NOT NULL DEFAULT 0",
    # The lease on the attempt's row, which every attempt writes anyway: a claim inserts the
    # attempt with its lease, the settlement's write of the row drops it (no lease row inserted
    # and deleted per attempt), and a fence reads one row. ``lease_token`` NULL: no lease.
    "ALTER TABLE conduit_execution ADD COLUMN lease_owner TEXT",
    "ALTER TABLE conduit_execution ADD COLUMN lease_token TEXT",
    "ALTER TABLE conduit_execution ADD COLUMN lease_expires_at_ms BIGINT",
    "ALTER TABLE conduit_execution ADD COLUMN lease_duration_ms BIGINT",
    "ALTER TABLE conduit_execution ADD COLUMN lease_released INTEGER NOT NULL DEFAULT 0",
    "UPDATE conduit_execution SET lease_owner = l.owner, lease_token = l.token, "
    "lease_expires_at_ms = l.expires_at_ms, lease_duration_ms = l.duration_ms, "
    "lease_released = l.released FROM conduit_lease AS l "
    "WHERE l.execution_id = conduit_execution.id",
    "DROP TABLE conduit_lease",
    # Recovery's scan for expired leases: live attempts only (an ended one holds no lease).
    "CREATE INDEX conduit_execution_lease_expiry ON conduit_execution (lease_expires_at_ms) "
    "WHERE live = 1",
)

# A claim consumes its inputs by raising its Work's ``input_floor`` alone: it no longer writes
# each input row (``pending = 0``), one row version fewer per job. Every read of an input's
# ``pending`` now takes the floor into account (``_sql.STILL_PENDING``); a control's ``drop``
# still clears the flag. Nothing to rewrite: the rows written before are right as they are.
# The version still moves, so that an older conduit, which reads only the flag and would take
# a consumed input for pending (a Routine's fire never settling), refuses this store. The input
# table no longer needs room on its pages for that write (V14's ``fillfactor = 70``): its pages
# fill again from now on (a control's ``drop`` is the only update left, and a rare one).
_V15 = (PerBackend(None, "ALTER TABLE conduit_event RESET (fillfactor)"),)

# The queue's gauges (``/metrics``, ``GET /v1/health``, ``/v1/capacity``'s "waiting for") read
# the ready Work's depth and oldest ``ready_since`` per binding and scope from this partial index
# alone (an index-only scan), no longer every ready row's page: with 100,000 ready Work, SQLite
# ~90 -> 13 ms, PostgreSQL 30-60 -> 20-31 ms a read. The claim's reads filter on ``binding`` as
# before.
_V16 = (
    "DROP INDEX conduit_work_ready_binding",
    "CREATE INDEX conduit_work_ready_binding ON conduit_work (binding, scope, ready_since) "
    "WHERE claimable = 1",
)

# A claim's read of one binding's ready Work, oldest first (SQLite: ``_ready_reads``, a read
# per binding where a claimer has more than one pool). Without it SQLite read a pool's bindings
# through ``conduit_work_ready_binding`` (binding, scope, ...), which is not in claim order
# across scopes: every ready row of those bindings read and sorted to keep a few, 25 ms a claim
# at a backlog of 50,000. PostgreSQL plans that read well without it (the ready index walked
# in claim order), so it does not pay for one more index.
_V17 = (
    PerBackend(
        "CREATE INDEX IF NOT EXISTS conduit_work_ready_order ON conduit_work "
        "(binding, ready_since, id) "
        "WHERE claimable = 1",
        None,
    ),
)

# The same index on PostgreSQL, and every claim's read of the ready queue now goes through it,
# a range per binding (``_ready_reads._one_binding_rows_sql``). A daemon's read filtered by its
# bindings while it walked the ready index in claim order, so Work of another binding queued
# ahead of its own (another daemon's backlog on a shared store) was passed by row by row at
# every claim: 28 ms a claim behind 50,000 of it, and growing with it.
_V18 = (
    PerBackend(
        None,
        "CREATE INDEX IF NOT EXISTS conduit_work_ready_order ON conduit_work "
        "(binding, ready_since, id) WHERE claimable = 1",
    ),
)

# Work of a concurrency key at its limit leaves the claim's read (issue 32, a sibling of V18's
# defect): a claim filtered it while walking the ready queue, so a key with a large backlog,
# its slot held, cost every claim a pass over that backlog (20 ms on SQLite, 43 ms on
# PostgreSQL behind 20,000). ``key_parked`` = 1: the Work is claimable but waits for its key,
# and is not in ``conduit_work_ready_order``. A Work is parked when it becomes claimable while
# its key's slot holders and unparked ready Work already fill the key's limit; a write that
# frees a place of the key unparks its oldest parked Work (``_key_parking``), and the daemon's
# sweep unparks any whose key has room (a write that raced the parking).
_V19 = (
    "ALTER TABLE conduit_work ADD COLUMN key_parked INTEGER NOT NULL DEFAULT 0",
    "DROP INDEX conduit_work_ready_order",
    "CREATE INDEX conduit_work_ready_order ON conduit_work (binding, ready_since, id) "
    "WHERE claimable = 1 AND key_parked = 0",
    # A key's unparked ready Work, counted (those ahead of it) when a Work of it becomes ready.
    "CREATE INDEX conduit_work_key_ready ON conduit_work (concurrency_key, ready_since) "
    "WHERE claimable = 1 AND key_parked = 0 AND concurrency_key IS NOT NULL",
    # A key's parked Work, oldest first (unparking), and the keys that have any (the sweep).
    "CREATE INDEX conduit_work_key_parked ON conduit_work (concurrency_key, ready_since, id) "
    "WHERE claimable = 1 AND key_parked = 1",
    # A key's backlog queued before the upgrade: all of it parked, and the daemon's sweep
    # unparks each key's oldest as its room allows (within a second of its start), so that
    # backlog too is out of the claim's read at once rather than once it has drained.
    "UPDATE conduit_work SET key_parked = 1 WHERE claimable = 1 AND concurrency_key IS NOT NULL",
)

# A claim where a scope limit shapes its read (a full scope skipped, a scope with room read
# apart) reads each (binding, scope) with ready Work through its own range of this index, in
# claim order (``_ready_reads._scope_ranges_later``), found first by a skip scan of it (a probe
# per pair): filtered while walking each binding's range instead, a full scope's backlog, or a
# limited scope's passed by the read of the rest, cost every claim a pass over it (issue 32:
# 9 ms on SQLite, 11 ms on PostgreSQL a claim behind 20,000; through the daemon, half of what
# it finished). ``key_parked`` keeps a key's parked backlog out of each range read (they read
# ``key_parked = 0``); ``id`` completes the claim order (ties of ``ready_since``). The queue's
# gauges still read this index alone (V16).
_V20 = (
    "DROP INDEX conduit_work_ready_binding",
    "CREATE INDEX conduit_work_ready_binding ON conduit_work "
    "(binding, scope, key_parked, ready_since, id) WHERE claimable = 1",
)

#: Ordered forward migrations; ``MIGRATIONS[i]`` takes a store from version ``i`` to ``i + 1``.
MIGRATIONS: tuple[tuple[str | PerBackend, ...], ...] = (
    _V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10, _V11, _V12, _V13, _V14, _V15, _V16, _V17,
    _V18, _V19, _V20,
)
SCHEMA_VERSION = len(MIGRATIONS)

#: Every table a conduit store owns (the meta table is created before any migration).
TABLES = (
    "conduit_meta",
    "conduit_counter",
    "conduit_work",
    "conduit_event",
    "conduit_execution",
    "conduit_timer",
    "conduit_hold",
    "conduit_wait",
    "conduit_control",
    "conduit_budget_ledger",
    "conduit_config_generation",
    "conduit_routine",
    "conduit_routine_run",
    "conduit_budget_pending",
    "conduit_daemon",
    "conduit_dependency",
    "conduit_submit_key",
)

META_DDL = "CREATE TABLE IF NOT EXISTS conduit_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
