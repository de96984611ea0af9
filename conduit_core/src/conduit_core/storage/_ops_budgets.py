"""Budgets and start gates as synchronous operations inside one transaction.

The admission transaction runs, per Work: eligibility, capacity, the start gates' hold (decided
outside the transaction), budgets, then the claim itself. Usage staged by attempt-state writes is
charged to the ledgers at the start of every admission transaction and by ``settle_budgets``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.model import (
    AttemptSnapshot,
    BudgetLedger,
    Event,
    Execution,
    Hold,
    HoldKind,
    Work,
)
from conduit_core.storage._admission import (
    BUDGET_HELD,
    BUDGET_RELEASED,
    GATE_HELD,
    GATE_REFUSED,
    GATE_RELEASED,
    AdmitRequest,
    BudgetPolicy,
    GateFilter,
    GateVerdict,
    LedgerSpec,
    PendingUsage,
)
from conduit_core.storage._contract import (
    Candidate,
    CapacityLimits,
    Claim,
    ClaimRefusal,
    ClaimRequest,
    NotEligibleError,
)
from conduit_core.storage._ops_misc import delete_hold, get_ledger, list_holds, put_hold
from conduit_core.storage._ops_work import (
    ClaimWrites,
    Slots,
    accept_event,
    cancel_work,
    claim_one,
    claim_refusal,
    first_pending_inputs,
    ineligibility,
    lock_work_rows_later,
    read_inputs_and_slots,
    work_rows,
)
from conduit_core.storage._ready_reads import read_ready_later
from conduit_core.storage._sql import (
    EVENTS_READ,
    Cx,
    Row,
    SetWrite,
    dump,
    find_work,
    load_work,
    lock_counter_rows,
    save_work,
    stored_event,
    write_rows,
)
from conduit_core.validation import saturating_add

__all__ = [
    "admission_candidates",
    "admit_attempts",
    "admit_ready",
    "charge_pending",
    "list_pending_usage",
    "release_budget_hold",
    "settle_gate_hold",
    "stage_usage",
    "work_events",
]

_pending_decoder = msgspec.json.Decoder(PendingUsage)
_ledger_decoder = msgspec.json.Decoder(BudgetLedger)


# --- Usage staging and charging -------------------------------------------------------------


#: Staged usage applied: its rows go (one statement for a pass's rows where the backend has
#: arrays).
_DROP_STAGED = SetWrite(
    "DELETE FROM conduit_budget_pending WHERE id = ?",
    "DELETE FROM conduit_budget_pending WHERE id = ANY(%b::text[])",
)
_STAGE_USAGE = SetWrite(
    "INSERT INTO conduit_budget_pending (id, work_id, data) VALUES (?, ?, ?) "
    "ON CONFLICT (id) DO NOTHING",
    "INSERT INTO conduit_budget_pending (id, work_id, data) "
    "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[]) ON CONFLICT (id) DO NOTHING",
    key=0,
)


def stage_usage(cx: Cx, ex: Execution, now_ms: int) -> Execution:
    """Stage the part of the attempt's usage not staged yet; returns it with ``charged`` set.

    ``ex`` is the attempt as stored (read in this transaction) with its new result, so a stale
    copy of the attempt never charges twice. A resumed segment reports its own usage and counts
    one turn (its start was no admission).
    """
    amounts = ex.result.usage.amounts() if ex.result is not None else {}
    same_segment = ex.charged_epoch == ex.epoch
    already = ex.charged if same_segment else {}
    delta = {
        unit: amount - already.get(unit, 0.0)
        for unit, amount in amounts.items()
        if math.isfinite(amount) and amount > already.get(unit, 0.0)
    }
    resumed = bool(ex.segments) and ex.segments[-1].wake_event_id is not None
    if resumed and not same_segment:
        delta["turns"] = 1.0
    if not delta:
        return ex
    pending = PendingUsage(
        id=f"{ex.id}@{ex.epoch}/{len(already)}",
        work_id=ex.work_id,
        scope=ex.scope,
        units=delta,
        staged_at_ms=now_ms,
    )
    # A row only this attempt's holder inserts: it may go with the batch's others (Cx.defer).
    cx.defer(_STAGE_USAGE, (pending.id, pending.work_id, dump(pending)))
    return msgspec.structs.replace(ex, charged=dict(amounts), charged_epoch=ex.epoch)


def list_pending_usage(cx: Cx) -> list[PendingUsage]:
    rows = cx.rows("SELECT data FROM conduit_budget_pending ORDER BY id")
    return [_pending_decoder.decode(r[0]) for r in rows]


def charge(
    cx: Cx, policy: BudgetPolicy, spec: LedgerSpec, amount: float, work_id: str, scope: str,
    now_ms: int,
) -> BudgetLedger:  # fmt: skip
    """Add ``amount`` to one ledger and accept the notices the charge crosses."""
    lock_ledgers(cx, [spec.key])
    ledger = _ledger(cx, spec)
    before = ledger.used
    # Saturates: two 1.7e308 charges once made inf, stored as null, and every pass then failed.
    used = saturating_add(ledger.used, amount)
    ledger = msgspec.structs.replace(
        ledger,
        used=used,
        warned=ledger.warned or (spec.warn_at is not None and used >= spec.warn_at * spec.max),
        exceeded=ledger.exceeded or used >= spec.max,
    )
    _save_ledger(cx, ledger)
    for event in policy.notices(spec, before, used, work_id, scope, now_ms):
        accept_event(cx, event)
    return ledger


def lock_ledgers(cx: Cx, keys: Sequence[str]) -> None:
    """Lock ledgers (a ``budget:<key>`` counter row each, in key order) until commit: a ledger
    is judged or charged only under its lock, so concurrent admissions neither admit past a
    limit nor lose a charge (a ledger not yet written has no row of its own to lock)."""
    names = sorted({f"budget:{key}" for key in keys})
    if names and cx.locks_rows:
        lock_counter_rows(cx, names)


def _ledger(cx: Cx, spec: LedgerSpec) -> BudgetLedger:
    return get_ledger(cx, spec.key) or BudgetLedger(
        key=spec.key,
        budget=spec.budget,
        unit=spec.unit,
        subject=spec.subject,
        window_start_ms=spec.window_start_ms,
    )


def _save_ledger(cx: Cx, ledger: BudgetLedger) -> None:
    cx.run(
        "INSERT INTO conduit_budget_ledger (key, data) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET data = excluded.data",
        (ledger.key, dump(ledger)),
    )


_STAGED_USAGE_SQL = "SELECT data FROM conduit_budget_pending ORDER BY id FOR UPDATE SKIP LOCKED"


def charge_pending(cx: Cx, policy: BudgetPolicy, now_ms: int) -> int:
    """Charge every staged usage to its ledgers (dropped without budgets); returns how many.

    Each staged row is taken by one charger (locked, ``SKIP LOCKED``: concurrent chargers take
    different rows), charged, then deleted: charged once.
    """
    return _charge_staged(cx, policy, now_ms, cx.rows(_STAGED_USAGE_SQL))


def _charge_staged(cx: Cx, policy: BudgetPolicy, now_ms: int, rows: list[Row]) -> int:
    staged = [_pending_decoder.decode(r[0]) for r in rows]
    if not staged:
        return 0
    if policy.enabled:
        charges = [
            (spec, amount, usage)
            for usage in staged
            for unit, amount in sorted(usage.units.items())
            for spec in policy.ledgers(usage.work_id, usage.scope, unit, usage.staged_at_ms)
        ]
        lock_ledgers(cx, [spec.key for spec, _, _ in charges])  # all at once, in key order
        for spec, amount, usage in charges:
            charge(cx, policy, spec, amount, usage.work_id, usage.scope, now_ms)
    write_rows(cx, _DROP_STAGED, [(u.id,) for u in staged])
    return len(staged)


def _over_budget(
    cx: Cx, policy: BudgetPolicy, work: Work, now_ms: int
) -> tuple[LedgerSpec, float] | None:
    specs = policy.ledgers(work.id, work.scope, None, now_ms)
    lock_ledgers(cx, [spec.key for spec in specs])
    for spec in specs:
        ledger = get_ledger(cx, spec.key)
        used = ledger.used if ledger is not None else 0.0
        if used >= spec.max:
            return spec, used
    return None


# --- Admission ------------------------------------------------------------------------------


def awaits_gates(work: Work) -> bool:
    """Whether the Work's next start is its first one, not yet let through by the gates."""
    return work.last_attempt == 0 and not work.gated and not work.gate_pass


def needs_gates(
    work: Work, gates: GateFilter | None, snapshot: AttemptSnapshot, first_input: Event | None
) -> bool:
    """Whether the start gates must be asked before this start: only before the first one, and
    only when a gate may hold it (``gates``; ``None``: no gate is registered)."""
    return gates is not None and awaits_gates(work) and gates(work, snapshot, first_input)


def admission_candidates(
    cx: Cx,
    work_ids: Sequence[str],
    snapshot_for: Callable[[Work], AttemptSnapshot | None],
    capacity: CapacityLimits | None,
) -> list[Candidate]:
    """A read-only dry run of the claim of named Work: which eligibility and capacity would let
    start (the ready queue is admitted by ``admit_ready``, without one).

    Slots are taken as if each admitted candidate were claimed, so the start gates are asked
    only for Work capacity would let start.
    """
    slots = Slots(cx, capacity, lock=False) if capacity is not None else None
    # The slot count and the candidates go to the server together.
    counted = slots.count_later() if slots is not None else None
    ids = list(dict.fromkeys(work_ids))
    rows = work_rows(cx, ids)  # the Work with its hold and slot flags, in one statement
    if counted is not None:
        counted()
    first_inputs = first_pending_inputs(cx, ids)
    out: list[Candidate] = []
    for work_id in ids:
        if work_id not in rows:
            continue
        snapshot = snapshot_for(rows[work_id][0])
        if snapshot is not None:
            out.append(_candidate(cx, rows[work_id], snapshot, slots, first_inputs.get(work_id)))
    return out


def _candidate(
    cx: Cx,
    row: tuple[Work, bool, bool],
    snapshot: AttemptSnapshot,
    slots: Slots | None,
    first_input: Event | None,
) -> Candidate:
    """A Work as a dry run of its claim leaves it: with the refusal eligibility or capacity
    would give it, else its slot counted as taken (so younger Work does not overtake it), and
    the first pending input its gates are shown."""
    work, held, holds_slot = row
    refused = claim_refusal(
        cx, work, work.id, snapshot.pool, slots, rows_checked=not (held or holds_slot)
    )
    if refused is None and slots is not None:
        slots.take(snapshot.pool, work.scope)
        slots.keys.take(work.concurrency_key)
    return Candidate(work, snapshot, refused, first_input)


def admit_attempts(
    cx: Cx,
    requests: Sequence[AdmitRequest],
    owner: str,
    now_ms: int,
    lease_ms: int,
    capacity: CapacityLimits | None,
    policy: BudgetPolicy,
    gates: GateFilter | None,
) -> list[Claim | ClaimRefusal]:
    """Claim attempts after capacity, a gate's hold and budgets, in one transaction.

    The Work rows are locked first (in id order), skipping rows another scheduler is claiming
    right now: that one will start them, this one refuses them at once instead of queueing.
    The staged usage, the Work rows and their pending input are read in one round trip (in that
    order: the input is read after its Work's lock), then the limits are locked and counted,
    then the staged usage is charged (ledgers after limits, as ``_admit_one`` takes them).
    """
    staged = cx.later(_STAGED_USAGE_SQL)
    ids = sorted({r.work_id for r in requests})
    locked_rows = lock_work_rows_later(cx, ids, skip_locked=True)
    writes = ClaimWrites(cx)  # the claims' rows, written together at the end
    inputs = writes.prefetch_later(ids)
    staged_rows = staged()
    locked = locked_rows()
    inputs(locked)  # only the Work this batch locked
    slots = Slots(cx, capacity, before_count=writes.flush) if capacity is not None else None
    if slots is not None:  # every limit this batch may need, locked at once in one order
        mine = [r for r in requests if r.work_id in locked]
        slots.prepare((r.snapshot.pool, locked[r.work_id][0].scope) for r in mine)
        slots.keys.prepare_later(locked[r.work_id][0].concurrency_key for r in mine)()
    # Ledgers after the limits' rows: charged first, they crossed another claim's order
    # (tests/storage/test_batch_lock_order.py).
    _charge_staged(cx, policy, now_ms, staged_rows)
    claims = [
        _admit_one(cx, r, locked[r.work_id], owner, now_ms, lease_ms, slots, policy,
                   gates, writes)
        if r.work_id in locked
        else _claimed_elsewhere(cx, r.work_id)
        for r in requests
    ]  # fmt: skip
    writes.flush()
    return claims


def admit_ready(
    cx: Cx,
    limit: int,
    snapshot_for: Callable[[Work], AttemptSnapshot | None],
    max_inputs: int | None,
    owner: str,
    now_ms: int,
    lease_ms: int,
    capacity: CapacityLimits | None,
    policy: BudgetPolicy,
    gates: GateFilter | None,
) -> tuple[list[Claim | ClaimRefusal], list[Candidate]]:
    """``admission_candidates`` and ``admit_attempts`` in one transaction, for the ready queue.

    Up to ``limit`` ready Work are locked, oldest first, skipping rows another scheduler is
    claiming right now (each takes different Work, where a dry run read by both would offer
    them the same oldest rows). Each is admitted as ``admit_attempts`` admits it, unless a start
    gate must be asked first: that Work is returned unclaimed, with the refusal capacity would
    give it now, its slot counted as taken so younger Work does not overtake it (as the dry run
    counts it), for ``admit_attempts`` after the gates were asked outside any transaction.
    """
    writes = ClaimWrites(cx)  # the claims' rows, written together at the end
    # Only as much of the queue as there are free slots for (see ``capacity_sized``).
    read = read_ready_later(cx, capacity, limit, writes)
    if read is None:
        return [], []
    slots = read.slots
    staged = cx.later(_STAGED_USAGE_SQL)
    staged_rows = staged()
    locked = read.rows()  # oldest first
    pinned = [(work_id, snapshot_for(row[0])) for work_id, row in locked.items()]
    # The input of the Work claimed now, and the first input the gates see of the rest.
    kept = [(w, snap) for w, snap in pinned if snap is not None]
    if not read.inputs_read:
        read_inputs_and_slots(
            writes,
            [w for w, _ in kept],
            slots,
            [(snap.pool, locked[w][0].scope) for w, snap in kept],
            [locked[w][0].concurrency_key for w, _ in kept],
        )
    # Ledgers are locked after the limits' rows (just above, or with the read), as
    # ``_admit_one``'s budget check does: a ledger taken first crossed another claim's order
    # (tests/storage/test_batch_lock_order.py).
    _charge_staged(cx, policy, now_ms, staged_rows)
    firsts = {w: next(iter(writes.pending_inputs(w, 1)), None) for w, _ in pinned}
    asked = {w for w, snap in pinned if snap and needs_gates(locked[w][0], gates, snap, firsts[w])}
    outcomes: list[Claim | ClaimRefusal] = []
    to_ask: list[Candidate] = []
    for work_id, snapshot in pinned:
        if snapshot is None:
            continue
        if work_id in asked:
            to_ask.append(_candidate(cx, locked[work_id], snapshot, slots, firsts[work_id]))
            continue
        request = AdmitRequest(work_id=work_id, snapshot=snapshot, max_inputs=max_inputs)
        # No gate to ask was decided above, in this transaction: not asked again (gates=None).
        admitted = _admit_one(cx, request, locked[work_id], owner, now_ms, lease_ms, slots,
                              policy, None, writes)  # fmt: skip
        outcomes.append(admitted)
    writes.flush()
    return outcomes, to_ask


def _claimed_elsewhere(cx: Cx, work_id: str) -> ClaimRefusal:
    if find_work(cx, work_id) is None:
        return ClaimRefusal(work_id=work_id, code="not_found", message=f"unknown work {work_id!r}")
    return ClaimRefusal(
        work_id=work_id,
        code="not_eligible",
        message=f"work {work_id!r} is being claimed by another scheduler",
    )


def _admit_one(
    cx: Cx,
    request: AdmitRequest,
    locked: tuple[Work, bool, bool],
    owner: str,
    now_ms: int,
    lease_ms: int,
    slots: Slots | None,
    policy: BudgetPolicy,
    gates: GateFilter | None,
    writes: ClaimWrites,
) -> Claim | ClaimRefusal:
    """``locked``: the Work (its row locked), whether it is held, whether an attempt of it holds
    its slot (live, or ended with its stop unconfirmed). ``writes``: the batch's claim writes."""
    work, held, live = locked
    work_id = work.id
    reason = ineligibility(work) or (
        f"work {work_id!r} is held" if held
        else f"work {work_id!r} has an attempt that holds its slot (live, or its stop "
        "unconfirmed)" if live
        else None
    )  # fmt: skip
    if reason is not None:
        return ClaimRefusal(work_id=work_id, code="not_eligible", message=reason)
    refused = claim_refusal(cx, work, work_id, request.snapshot.pool, slots, rows_checked=True)
    if refused is not None:
        return refused
    if request.gates is GateVerdict.SKIP:
        first_input = next(iter(writes.pending_inputs(work_id, 1)), None)
        gated = needs_gates(work, gates, request.snapshot, first_input)
    else:  # the gates were asked: their verdict stands while the start is still the first
        gated = awaits_gates(work)
    if gated and request.gates is GateVerdict.SKIP:
        return ClaimRefusal(
            work_id=work_id,
            code="not_eligible",
            message=f"work {work_id!r} changed since its start gates were considered",
        )
    if gated and request.gates is GateVerdict.HOLD:
        put_hold(cx, _hold(work, HoldKind.GATE, request.holder, request.reason, now_ms))
        _record(cx, work, GATE_HELD, request.holder, now_ms, gate=request.holder,
                reason=request.reason)  # fmt: skip
        return ClaimRefusal(
            work_id=work_id,
            code="gate_held",
            message=f"start gate {request.holder!r} holds work {work_id!r}: {request.reason}",
        )
    if gated and not work.gated:
        # The gates let it start: a budget hold below never asks them again (written with the
        # hold below, or with the claim).
        work = msgspec.structs.replace(work, gated=True)
    if not work.budget_pass and (over := _over_budget(cx, policy, work, now_ms)) is not None:
        if gated:
            save_work(cx, work)
        spec, used = over
        reason = (
            f"budget {spec.budget!r}: {used:g} of {spec.max:g} {spec.unit} used "
            f"({spec.subject}, window from {spec.window_start_ms} ms)"
        )
        put_hold(cx, _hold(work, HoldKind.BUDGET, spec.key, reason, now_ms))
        _record(cx, work, BUDGET_HELD, spec.key, now_ms, budget=spec.budget, reason=reason)
        # A limit lowered below what was already used is reported here too.
        for event in policy.notices(spec, used, used, work.id, work.scope, now_ms):
            accept_event(cx, event)
        return ClaimRefusal(work_id=work_id, code="over_budget", message=reason)

    def spend_passes(current: Work) -> Work:
        gated_now = current.gated or current.gate_pass or gated
        return msgspec.structs.replace(current, gate_pass=False, budget_pass=False, gated=gated_now)

    claim = claim_one(
        cx,
        work,
        ClaimRequest(
            work_id=work_id,
            snapshot=request.snapshot,
            max_inputs=request.max_inputs,
            update_work=spend_passes,
        ),
        owner,
        now_ms,
        lease_ms,
        slots,
        checked=True,  # claim_refusal above; since then at most the Work row was saved
        writes=writes,
    )
    if isinstance(claim, Claim):
        for unit in ("turns", "attempts"):
            for spec in policy.ledgers(work.id, work.scope, unit, now_ms):
                charge(cx, policy, spec, 1.0, work.id, work.scope, now_ms)
    return claim


def _hold(work: Work, kind: HoldKind, holder: str, reason: str, now_ms: int) -> Hold:
    return Hold(work_id=work.id, kind=kind, holder=holder, reason=reason, created_at_ms=now_ms)


def _record(
    cx: Cx, work: Work, kind: str, holder: str, now_ms: int, *, key: str | None = None,
    actor: str | None = None, **payload: str,
) -> Event:  # fmt: skip
    """A control event addressed to the Work: its history, never its input."""
    delivery = f"{kind}/{work.id}/{holder}/{key if key is not None else now_ms}"
    return accept_event(
        cx,
        Event(
            id=delivery,
            delivery_id=delivery,
            type=kind,
            payload={"work": work.id, **payload},
            work_id=work.id,
            scope=work.scope,
            pending=False,
            accepted_at_ms=now_ms,
            actor=actor,
        ),
    )


# --- Settling holds -------------------------------------------------------------------------


def release_budget_hold(
    cx: Cx, work_id: str, reason: str, now_ms: int, actor: str | None = None
) -> Work:
    """Delete the Work's budget holds and leave it a pass for its next admitted start."""
    holds = list_holds(cx, work_id)
    budget = [h for h in holds if h.kind is HoldKind.BUDGET]
    if not budget:
        load_work(cx, work_id)  # NotFoundError for unknown Work
        gates = [h.holder for h in holds if h.kind is HoldKind.GATE]
        if gates:
            raise ConduitError(
                f"work {work_id!r} is held by start gate {gates[0]!r}, which only that gate "
                f"settles (cancel the Work instead)",
                code="gate_hold",
            )
        raise NotEligibleError(f"work {work_id!r} has no budget hold", code="not_held")
    for hold in budget:
        delete_hold(cx, work_id, hold.kind, hold.holder)
        work = load_work(cx, work_id)
        _record(cx, work, BUDGET_RELEASED, hold.holder, now_ms, key=str(hold.created_at_ms),
                actor=actor, reason=reason)  # fmt: skip
    work = msgspec.structs.replace(load_work(cx, work_id), budget_pass=True)
    save_work(cx, work)
    return work


def settle_gate_hold(
    cx: Cx, work_id: str, gate: str, admit: bool, reason: str, now_ms: int,
    actor: str | None = None,
) -> Work:
    """Only the holding registration settles: admit leaves a gate pass, refuse cancels."""
    work = load_work(cx, work_id)
    held = [h for h in list_holds(cx, work_id) if h.kind is HoldKind.GATE and h.holder == gate]
    wanted = GATE_RELEASED if admit else GATE_REFUSED
    if not held:
        settled = [
            e for e in work_events(cx, work_id)
            if e.type in (GATE_RELEASED, GATE_REFUSED)
            and isinstance(e.payload, dict) and e.payload.get("gate") == gate
        ]  # fmt: skip
        if settled and settled[-1].type == wanted:
            return work  # settled the same way already: idempotent
        if settled:
            raise NotEligibleError(
                f"gate {gate!r} already settled work {work_id!r} ({settled[-1].type})",
                code="gate_hold_settled",
            )
        holders = [f"{h.kind}:{h.holder}" for h in list_holds(cx, work_id)]
        raise NotEligibleError(
            f"work {work_id!r} is not held by start gate {gate!r}"
            + (f" (held by {', '.join(holders)})" if holders else ""),
            code="no_gate_hold",
        )
    hold = held[0]
    delete_hold(cx, work_id, HoldKind.GATE, gate)
    _record(cx, work, wanted, gate, now_ms, key=str(hold.created_at_ms), gate=gate,
            actor=actor, reason=reason)  # fmt: skip
    if not admit:
        return cancel_work(cx, work_id, now_ms, actor)
    work = load_work(cx, work_id)
    work = msgspec.structs.replace(work, gate_pass=True, gated=True)
    save_work(cx, work)
    return work


def work_events(cx: Cx, work_id: str) -> list[Event]:
    """Every event addressed to the Work (input and control history), in acceptance order."""
    rows = cx.rows(EVENTS_READ + "WHERE e.work_id = ? ORDER BY e.seq", (work_id,))
    return [stored_event(r) for r in rows]


def held_work(cx: Cx) -> list[tuple[Hold, Work]]:
    """Every hold with its Work (the needs-you list)."""
    out = []
    for hold in list_holds(cx, None):
        work = find_work(cx, hold.work_id)
        if work is not None and not work.status.terminal:
            out.append((hold, work))
    return out
