"""The ready queue as a claim reads it: only as much of it as there are free slots for, in
one round trip where the limits are known before it is read (``read_ready_later``), and the
claims made from it (``claim_ready``). ``admit_ready`` (``_ops_budgets``) reads it the same way."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from conduit_core.model import AttemptSnapshot, Event, Work
from conduit_core.storage._contract import CapacityLimits, Claim, ClaimRefusal, ClaimRequest
from conduit_core.storage._keys import READY_KEY_FILTER, keys_checked
from conduit_core.storage._ops_work import (
    UNBLOCKED,
    ClaimWrites,
    Slots,
    claim_one,
    decoded_work_rows,
    read_inputs_and_slots,
    work_rows_select,
)
from conduit_core.storage._scope_ranges import (
    MAX_PAIRS,
    PresentScopes,
    present_scopes_later,
    scope_ranges_sql,
)
from conduit_core.storage._sql import Codec, Cx, Row, is_claimable, ready_rank, save_work
from conduit_core.storage._unsafe import unsafe


class ReadySlice(NamedTuple):
    """One read of the ready queue: at most ``limit`` rows, of ``bindings`` only (``None``:
    of any binding), of ``scopes_in`` only (empty: of any scope) and of none of ``scopes_out``."""

    limit: int
    bindings: tuple[str, ...] | None = None
    scopes_in: tuple[str, ...] = ()
    scopes_out: tuple[str, ...] = ()


class ReadySlices(NamedTuple):
    """The reads a claim makes of the ready queue (one per pool with a free slot), none of
    them of ``skip_scopes`` (a limit of the scope or of an ancestor of it is full) nor of
    ``skip_bindings`` (the claimer lacks a host label they require), and with ``keyed`` none
    of Work whose concurrency key is at its limit (``READY_KEY_FILTER``)."""

    parts: tuple[ReadySlice, ...]
    skip_scopes: tuple[str, ...] = ()
    skip_bindings: tuple[str, ...] = ()
    keyed: bool = False


def capacity_sized(slots: Slots, limit: int) -> ReadySlices | None:
    """The ready Work worth reading for up to ``limit`` claims, from the slot holders
    ``slots`` counted: for each pool with a free slot, as many of its bindings' oldest rows as
    it has free slots; none of a full scope; ``None`` when no slot is free (nothing is read).

    This keeps a backlog from costing a claim anything: Work that capacity would refuse is not
    read, locked or refused row by row. When the count was taken without the limits' locks it
    is an estimate; every claim is still checked against the locked count (``refusal``).
    """
    limits = slots.limits
    keyed = limits.concurrency_keys and keys_checked()
    if unsafe("capacity_check"):
        # A race detector's negative control (_unsafe): capacity only, labels still hold.
        return ReadySlices((ReadySlice(limit),), skip_bindings=limits.skip_bindings, keyed=keyed)

    def free_in(key: str | None) -> int:
        cap = limits.global_limit if key is None else limits.pool_limits[key]
        return limit if cap is None else min(limit, max(cap - slots.by_pool[key], 0))

    parts: list[ReadySlice] = []
    if limits.binding_pools:
        by_key: dict[str | None, list[str]] = {}
        for binding, pool in sorted(limits.binding_pools.items()):
            if binding in limits.skip_bindings:
                continue
            by_key.setdefault(slots.pool_key(pool), []).append(binding)
        for key, bindings in by_key.items():
            if (n := free_in(key)) > 0:
                # Only the bindings this claimer starts, even with one pool for all: the oldest
                # ready rows may be Work it cannot pin (a binding it lacks, or whose executor it
                # has not loaded), and a read sized by the free slots would find only those,
                # every pass, while the Work behind them waited. Each binding is read through
                # its own range of ``conduit_work_ready_order`` (``_one_binding_rows_sql``), so
                # another binding's backlog, however far ahead, costs the read nothing.
                parts.append(ReadySlice(n, tuple(bindings)))
    else:
        frees = [free_in(key) for key in {None, *limits.pool_limits}]
        if any(frees):
            parts.append(ReadySlice(min(limit, sum(frees))))
    if not parts:
        return None
    full = {s for s, cap in limits.scope_limits.items() if slots.by_scope[s] >= cap}
    skip: tuple[str, ...] = ()
    if full:
        known = {*limits.scope_limits, *limits.scope_parents, *limits.scope_parents.values()}
        skip = tuple(sorted(s for s in known if full.intersection(limits.ancestry(s))))
    if groups := _scope_groups(slots, full):
        parts = _by_scope_group(parts, groups)
    return ReadySlices(tuple(parts), skip, limits.skip_bindings, keyed)


def _scope_groups(slots: Slots, full: set[str]) -> list[tuple[int, tuple[str, ...]]]:
    """The scopes under a limit with room, grouped by their outermost limited scope: each
    group's headroom (that scope's free slots, which every scope under it shares) and its
    scopes."""
    limits = slots.limits
    if not limits.scope_limits:
        return []
    known = {*limits.scope_limits, *limits.scope_parents, *limits.scope_parents.values()}
    groups: dict[str, tuple[int, list[str]]] = {}
    for scope in sorted(known):
        limited = [s for s in limits.ancestry(scope) if s in limits.scope_limits]
        if not limited or full.intersection(limited):
            continue  # under no limit, or under a full one (skipped whole)
        top = limited[-1]
        room = limits.scope_limits[top] - slots.by_scope[top]
        groups.setdefault(top, (room, []))[1].append(scope)
    return [(room, tuple(scopes)) for room, scopes in groups.values()]


def _by_scope_group(
    parts: list[ReadySlice], groups: list[tuple[int, tuple[str, ...]]]
) -> list[ReadySlice]:
    """Each pool's read split by scope limit: at most a group's headroom of its scopes' Work,
    and the rest outside every limited scope. A read sized by the pool alone would lock rows a
    scope limit then refuses, and other claimers' ``SKIP LOCKED`` reads pass them by: with
    several daemons, a scope with room for one took one claimer's read of three rows, and the
    other claimer found none to take."""
    grouped = tuple(sorted(s for _, scopes in groups for s in scopes))
    split: list[ReadySlice] = []
    for part in parts:
        split.append(part._replace(scopes_out=grouped))
        split += [part._replace(limit=min(part.limit, room), scopes_in=scopes)
                  for room, scopes in groups]  # fmt: skip
    return split


class SizedRead(NamedTuple):
    """``sized_batch``'s answer: the limits counted, the slices worth reading, and the scopes
    with ready Work per binding where scope limits apply (sent with the count)."""

    slots: Slots | None = None
    only: ReadySlices | None = None
    present: PresentScopes | None = None


def sized_batch(
    cx: Cx, capacity: CapacityLimits | None, limit: int, writes: ClaimWrites
) -> SizedRead | None:
    """A claim batch's ``Slots`` (counted) and the slices of the ready queue worth reading
    (``capacity_sized``); ``None`` when no slot is free, so nothing is read. Where scope limits
    apply, the scopes with ready Work go to the server with the count (one round trip): the
    read is then by scope range (``_by_scope``)."""
    if capacity is None:
        return SizedRead()
    slots = Slots(cx, capacity, before_count=writes.flush)
    counted = slots.count_later()
    present = None
    if capacity.scope_limits and capacity.binding_pools:
        mine = sorted(b for b in capacity.binding_pools if b not in capacity.skip_bindings)
        present = present_scopes_later(cx, mine)
    counted()
    only = capacity_sized(slots, limit)
    return None if only is None else SizedRead(slots, only, present)


def lock_ready_work_rows_later(
    cx: Cx, limit: int, only: ReadySlices | None = None, present: PresentScopes | None = None
) -> Callable[[], dict[str, tuple[Work, bool, bool]]]:
    """``ready_work`` and ``work_rows`` of what it finds, in one statement: the startable Work,
    oldest first, each with its hold and slot flags, each row locked, skipping rows another
    claim holds (several schedulers then take different Work instead of the same oldest rows).
    The flags come from the statement's snapshot, as with ``lock_work_rows`` and
    ``skip_locked``. ``only``: just those slices of it (``capacity_sized``; a statement each,
    all sent at once), the oldest ``limit`` of what they find; where a scope limit shapes them
    and ``present`` was sent (the scopes with ready Work per binding, ``sized_batch``), by
    scope range."""
    if only is None:
        only = ReadySlices((ReadySlice(limit),))
    if present is not None and _by_scope(only):
        return _scope_ranges_later(cx, limit, only, present)
    reads = [_walk_later(cx, only, part, limit) for part in only.parts]  # per part
    return lambda: _oldest(reads, limit)


def _walk_later(
    cx: Cx, only: ReadySlices, part: ReadySlice, limit: int
) -> Callable[[], list[Row]]:
    """One slice's read, walking each of its bindings' range in claim order (or the whole ready
    queue) and filtering out what it does not take as it goes: full scopes, its own exclusions,
    bindings the claimer lacks, keys at their limit."""
    filters = READY_KEY_FILTER if only.keyed else ""
    if only.skip_scopes:
        filters += f" AND w.scope NOT IN ({', '.join('?' for _ in only.skip_scopes)})"
    if only.skip_bindings:
        filters += f" AND w.binding NOT IN ({', '.join('?' for _ in only.skip_bindings)})"
    params: tuple[object, ...] = (*only.skip_scopes, *only.skip_bindings)
    if part.scopes_in:
        filters += f" AND w.scope IN ({', '.join('?' for _ in part.scopes_in)})"
        params += part.scopes_in
    if part.scopes_out:
        filters += f" AND w.scope NOT IN ({', '.join('?' for _ in part.scopes_out)})"
        params += part.scopes_out
    size = min(limit, part.limit)
    if part.bindings is None:
        lock = " FOR UPDATE OF w SKIP LOCKED" if cx.locks_rows else ""
        return cx.later(_ready_work_rows_sql(filters) + lock, (*params, size))
    return cx.later(*_bindings_rows_sql(cx, part.bindings, filters, params, size))


def _oldest(
    reads: list[Callable[[], list[Row]]], limit: int
) -> dict[str, tuple[Work, bool, bool]]:
    """The oldest ``limit`` rows of ``reads`` (each in claim order), in claim order."""
    found: list[tuple[Work, bool, bool]] = []
    for read in reads:
        found += decoded_work_rows(read()).values()
    if len(reads) > 1:
        found.sort(key=_claim_order)
    return {row[0].id: row for row in found[:limit]}


def _by_scope(only: ReadySlices) -> bool:
    """Whether a scope limit shapes the read (a full scope skipped, a scope with room read
    apart from the rest), each slice of known bindings: then it is read by scope range."""
    shaped = bool(only.skip_scopes) or any(p.scopes_in or p.scopes_out for p in only.parts)
    return shaped and all(p.bindings is not None for p in only.parts)


def _scope_ranges_later(
    cx: Cx, limit: int, only: ReadySlices, present: PresentScopes
) -> Callable[[], dict[str, tuple[Work, bool, bool]]]:
    """``lock_ready_work_rows_later`` where a scope limit shapes the read (``_scope_ranges``):
    from the scopes with ready Work per binding (``present``), each slice's pairs of binding
    and scope, less every full scope and each slice's own exclusions, read through their own
    ranges (one statement per slice, all sent at once)."""
    skip = set(only.skip_scopes)
    filters = READY_KEY_FILTER if only.keyed else ""

    def take_in() -> dict[str, tuple[Work, bool, bool]]:
        scopes_of = present()
        reads: list[Callable[[], list[Row]]] = []
        for part in only.parts:
            pairs = [
                (binding, scope)
                for binding in part.bindings or ()
                for scope in sorted(scopes_of.get(binding, ()))
                if scope not in skip and scope not in part.scopes_out
                and (not part.scopes_in or scope in part.scopes_in)
            ]
            if len(pairs) > MAX_PAIRS:
                reads.append(_walk_later(cx, only, part, limit))  # a statement's bound
            elif pairs:
                size = min(limit, part.limit)
                reads.append(cx.later(*scope_ranges_sql(cx, pairs, filters, size)))
        return _oldest(reads, limit)

    return take_in


def _claim_order(row: tuple[Work, bool, bool]) -> tuple[int, str]:
    return ready_rank(row[0]), row[0].id


def _ready_work_rows_sql(filters: str = "", limit: str = "?", columns: str = "") -> str:
    return work_rows_select(columns) + _ready_where(filters, limit)


def _ready_where(filters: str, limit: str, binding: str | None = None) -> str:
    """The ready rows' ``WHERE``, claim order and ``LIMIT``; ``binding``: of that binding only
    (a ``?``, or a column of a lateral join's outer row), read as ``_one_binding_rows_sql``
    says."""
    order = "w.ready_since, w.id"
    if binding is not None:
        filters += f" AND w.binding >= {binding} AND w.binding <= {binding}"
        order = "w.binding, " + order
    return (
        "WHERE w.claimable = 1 AND w.key_parked = 0 AND "
        f"{UNBLOCKED.replace('conduit_work.', 'w.')}{filters} "
        f"ORDER BY {order} LIMIT {limit}"
    )


def _one_binding_rows_sql(filters: str, limit: str = "?", columns: str = "") -> str:
    """The oldest ready rows of one binding (two parameters, both the binding, before the
    limit): a walk of that binding's range of ``conduit_work_ready_order`` (binding,
    ready_since, id) in claim order that stops at its ``LIMIT``. Read any other way, a claim
    walked the whole ready queue in claim order past every row of another binding queued
    ahead of its own (another daemon's backlog on a shared store: 28-30 ms a claim behind
    50,000 of it, on either store), or read and sorted every ready row of its own
    (``tests/storage/test_ready_binding_filter.py``).

    The binding is a range of one value, and the order starts with it, so that this index is
    the only one that gives the order: given ``binding = ?``, PostgreSQL's planner counts the
    binding a constant, drops it from the order, and then walks the ready index
    (``conduit_work_claimable``) filtering by binding whenever the binding is common in its
    statistics, which say nothing of where in the queue its rows are."""
    return work_rows_select(columns) + _ready_where(filters, limit, "?")


def _bindings_rows_sql(
    cx: Cx, bindings: tuple[str, ...], filters: str, params: tuple[object, ...], size: int
) -> tuple[str, tuple[object, ...]]:
    """One statement for the oldest ``size`` ready rows (of ``filters``) of ``bindings``, each
    binding read as ``_one_binding_rows_sql`` reads one, the oldest of them all kept by the
    statement: PostgreSQL, a lateral subquery per binding, its rows locked; SQLite, a ``UNION
    ALL`` of their ids, the rows of the oldest read after. (Twenty bindings read one statement
    each, every row taken in, cost a SQLite claim 0.6 ms, ten times the walk it replaced.)"""
    if cx.locks_rows:
        return _locked_bindings_rows_sql(bindings, filters, params, "?", (size,))
    if len(bindings) == 1:
        return _one_binding_rows_sql(filters), (*params, *bindings, *bindings, size)
    # Each binding's oldest ids from the index alone, the oldest of them all, then their rows.
    each = (
        "SELECT * FROM (SELECT w.ready_since, w.id FROM conduit_work w "
        f"{_ready_where(filters, '?', '?')})"
    )
    oldest = f"SELECT id FROM ({' UNION ALL '.join(each for _ in bindings)}) " + _IN_ORDER
    sql = work_rows_select() + f"WHERE w.id IN ({oldest}) ORDER BY w.ready_since, w.id"
    return sql, (*(value for b in bindings for value in (*params, b, b, size)), size)


#: The oldest of several reads, and their ``LIMIT``.
_IN_ORDER = "ORDER BY ready_since, id LIMIT ?"


def _locked_bindings_rows_sql(
    bindings: tuple[str, ...],
    filters: str,
    params: tuple[object, ...],
    limit: str,
    limit_params: tuple[object, ...],
    columns: str = "",
) -> tuple[str, tuple[object, ...]]:
    """PostgreSQL: ``_bindings_rows_sql``'s statement, its rows locked (``SKIP LOCKED``), with
    a ``limit`` of its own (an expression, and its parameters) and the ``columns`` asked for:
    one binding's range, or a lateral subquery per binding (``_lateral_rows_sql``)."""
    if len(bindings) == 1:
        sql = _one_binding_rows_sql(filters, limit, columns) + " FOR UPDATE OF w SKIP LOCKED"
        return sql, (*params, *bindings, *bindings, *limit_params)
    sql = _lateral_rows_sql(len(bindings), filters, limit, columns)
    return sql, (*bindings, *params, *limit_params, *limit_params)


def _lateral_rows_sql(count: int, filters: str, limit: str, columns: str = "") -> str:
    """PostgreSQL: the oldest ``limit`` ready rows of ``count`` bindings (a ``?`` each, first),
    each binding's read from its own range of the index and locked (``SKIP LOCKED``), as
    ``_one_binding_rows_sql`` reads one (a lateral subquery per binding); ``limit`` is written
    twice, each binding's and the whole read's."""
    each = (
        "(SELECT w.* FROM conduit_work w "
        f"{_ready_where(filters, limit, 'mine.binding')} FOR UPDATE OF w SKIP LOCKED) w"
    )
    values = ", ".join("(?)" for _ in range(count))
    source = f"(VALUES {values}) AS mine (binding) CROSS JOIN LATERAL {each}"
    return work_rows_select(columns, source) + f"ORDER BY w.ready_since, w.id LIMIT {limit}"


#: The startable Work with the flags ``work_rows`` gives, oldest first (a claim's read).
_READY_WORK_ROWS_SQL = _ready_work_rows_sql()


def claim_ready(
    cx: Cx,
    limit: int,
    snapshot_for: Callable[[Work], AttemptSnapshot | None],
    owner: str,
    now_ms: int,
    lease_ms: int,
    capacity: CapacityLimits | None,
) -> list[Claim | ClaimRefusal]:
    """Claim up to ``limit`` ready Work, oldest first, reading no more of the queue than there
    are free slots for (``capacity_sized``): every row read is decided in memory, from the
    flags read with it and the slots counted once (no statement per row, claimed or not)."""
    writes = ClaimWrites(cx)
    read = read_ready_later(cx, capacity, limit, writes)
    if read is None:
        return []
    requests: list[tuple[Work, ClaimRequest]] = []
    refusals: list[Claim | ClaimRefusal] = []
    for work, held, blocked in read.rows().values():
        if not is_claimable(work):
            # A row whose column was written under an older rule (idle standing Work counted
            # as claimable): rewrite it, which recomputes the column, and pass it by.
            save_work(cx, work)
        elif held or blocked:
            what = "is held" if held else "has an attempt holding its slot"
            refusals.append(ClaimRefusal(work_id=work.id, code="not_eligible",
                                         message=f"work {work.id!r} {what}"))  # fmt: skip
        elif (snapshot := snapshot_for(work)) is not None:
            requests.append((work, ClaimRequest(work_id=work.id, snapshot=snapshot)))
    if not read.inputs_read:
        targets = [(r.snapshot.pool, w.scope) for w, r in requests]
        keys = [w.concurrency_key for w, _ in requests]
        read_inputs_and_slots(writes, [w.id for w, _ in requests], read.slots, targets, keys)
    claims: list[Claim | ClaimRefusal] = [
        claim_one(cx, w, r, owner, now_ms, lease_ms, read.slots, rows_checked=True, writes=writes)
        for w, r in requests
    ]
    writes.flush()
    return claims + refusals


class ReadyRead(NamedTuple):
    """A claim batch's read of the ready queue, sent: ``rows`` takes the locked rows in
    (``lock_ready_work_rows_later``'s), ``slots`` the limits counted (``None``: no limits);
    ``inputs_read``: their pending input and their limits' locks and counts came with them
    (``read_inputs_and_slots`` has nothing left to do)."""

    slots: Slots | None
    rows: Callable[[], dict[str, tuple[Work, bool, bool]]]
    inputs_read: bool


def read_ready_later(
    cx: Cx, capacity: CapacityLimits | None, limit: int, writes: ClaimWrites
) -> ReadyRead | None:
    """A claim batch's read of the ready queue: only as much of it as there are free slots for
    (``sized_batch``), in one round trip where the limits are known before the queue is read
    (``_read_at_once``); ``None`` when no slot is free (nothing read)."""
    at_once = _read_at_once(cx, capacity, limit, writes)
    if at_once is not None:
        return at_once
    sized = sized_batch(cx, capacity, limit, writes)
    if sized is None:
        return None
    rows = lock_ready_work_rows_later(cx, limit, sized.only, sized.present)
    return ReadyRead(sized.slots, rows, inputs_read=False)


#: Each ready row's pending input, as a column (PostgreSQL: the events' documents, oldest
#: first), for ``_read_at_once``.
_INPUTS_COLUMN = (
    ", ARRAY(SELECT e.data FROM conduit_event e WHERE e.work_id = w.id AND e.pending = 1 "
    "AND e.seq > w.input_floor ORDER BY e.seq)"
)


def _read_at_once(
    cx: Cx, capacity: CapacityLimits | None, limit: int, writes: ClaimWrites
) -> ReadyRead | None:
    """A claim batch's reads sent together, where its limits are known before the queue is
    read: PostgreSQL, every binding this claimer starts counting against one pool (or the
    global limit), no scope limit, no concurrency key. The limit's counter row locked, its slot
    holders counted, the oldest ready rows it has room for locked with their pending input: one
    round trip, where ``sized_batch``, the rows and then their input and limits take three.
    (``None`` elsewhere.)

    The read is sized by the limit's free slots as the statement counts them (after the
    lock, as the count is): the count taken in then keeps the oldest rows it has slots for (a
    slot freed between the two statements may leave a row of the read locked, unclaimed)."""
    if capacity is None or not cx.locks_rows or capacity.scope_limits:
        return None
    if capacity.concurrency_keys or unsafe("capacity_check"):
        return None  # (the check off, a read sized by the free slots would still keep it)
    skip = capacity.skip_bindings
    pools = [pool for binding, pool in capacity.binding_pools.items() if binding not in skip]
    slots = Slots(cx, capacity, before_count=writes.flush)
    keys = {slots.pool_key(pool) for pool in pools}
    if len(keys) != 1:
        return None
    (key,) = keys
    counted = slots.prepare_later([(pools[0], "")])
    read = cx.later(*read_at_once_sql(capacity, key, limit))

    def take_in() -> dict[str, tuple[Work, bool, bool]]:
        counted()
        only = capacity_sized(slots, limit)
        free = 0 if only is None else only.parts[0].limit
        found: dict[str, tuple[Work, bool, bool]] = {}
        inputs: dict[str, list[Event]] = {}
        for data, held, blocked, events in read()[:free]:
            work = Codec.work.decode(data)
            found[work.id] = (work, bool(held), bool(blocked))
            inputs[work.id] = [Codec.event.decode(e) for e in events]
        writes.prefetched(inputs)
        return found

    return ReadyRead(slots, take_in, inputs_read=True)


def read_at_once_sql(
    capacity: CapacityLimits, key: str | None, limit: int
) -> tuple[str, tuple[object, ...]]:
    """``_read_at_once``'s read of the ready queue and its parameters: the oldest ready rows
    that the limit of pool ``key`` (``None``: the global limit) has free slots for, locked,
    each with its pending input.

    Its values are written into the statement (``_inlined``), which then has no parameters:
    PostgreSQL plans a prepared statement without parameters once, where with them it planned
    this one afresh at every claim (~0.2 ms of the server's time, while the claim held the
    limit's row lock; about half of all planning in a ``bench_daemon`` run). They are the
    claimer's configuration (its limits, pools, the bindings it starts) and the batch's size: a
    few texts per daemon, each prepared once per connection."""
    skip = capacity.skip_bindings
    mine = tuple(sorted(b for b in capacity.binding_pools if b not in skip))
    size, size_params = _free_slots_limit(capacity, key, limit)
    # What it starts, read as ``capacity_sized``'s reads are.
    return _inlined(*_locked_bindings_rows_sql(mine, "", (), size, size_params, _INPUTS_COLUMN))


#: Text written into a statement as it is: a name as configuration allows it (no quote, no
#: backslash, no placeholder character).
_PLAIN_TEXT = re.compile(r"[A-Za-z0-9_.-]*")


def _inlined(sql: str, params: tuple[object, ...]) -> tuple[str, tuple[object, ...]]:
    """``sql`` with each ``?`` replaced by its value (integers, and text of ``_PLAIN_TEXT``
    only), and no parameters left; unchanged when any value is something else (a name from a
    caller that skipped configuration's checks keeps its parameter)."""
    literals = []
    for value in params:
        if isinstance(value, int) and not isinstance(value, bool):
            literals.append(str(value))
        elif isinstance(value, str) and _PLAIN_TEXT.fullmatch(value):
            literals.append(f"'{value}'")
        else:
            return sql, params
    parts = sql.split("?")  # one more than the values: ``strict`` says so
    return "".join(part + literal for part, literal in zip(parts, [*literals, ""], strict=True)), ()


def _free_slots_limit(
    capacity: CapacityLimits, key: str | None, limit: int
) -> tuple[str, tuple[object, ...]]:
    """A ``LIMIT`` of ``limit`` rows or, when the pool ``key`` (``None``: the global limit) is
    limited, as many as it has free slots, counted by the statement itself, and its
    parameters. The global limit counts the attempts of every pool without a limit of its own
    (``Slots.pool_key``)."""
    cap = capacity.global_limit if key is None else capacity.pool_limits[key]
    params: tuple[str, ...]
    if cap is None:
        return "?", (limit,)
    if key is not None:
        mine, params = "x.pool = ?", (key,)
    elif capacity.pool_limits:
        own = tuple(capacity.pool_limits)
        mine = f"(x.pool IS NULL OR x.pool NOT IN ({', '.join('?' for _ in own)}))"
        params = own
    else:
        mine, params = "TRUE", ()
    holders = f"(SELECT COUNT(*) FROM conduit_execution x WHERE x.holds_slot = 1 AND {mine})"
    return f"GREATEST(LEAST(?, ? - {holders}), 0)", (limit, cap, *params)
