"""Dependencies between Work (``after``): checked and linked at submit, settled with the
dependency's end, all inside the store's transactions.

Durability comes from where the decisions are made, not from anything held in memory: the
submit that links a dependent and the write that ends a dependency both lock the dependency's
row, so one of them sees the other's committed outcome. A submit that finds the dependency
already ended decides the dependent at once; otherwise it records the edge
(``conduit_dependency``) and marks the dependency ``has_dependents``, and the transaction that
ends the dependency (any write of a terminal status, through ``save_work``) settles every
dependent before it commits. A crash therefore leaves either both or neither.

Work without ``after`` pays nothing: its submit reads nothing more, and only a Work flagged
``has_dependents`` looks for dependents when it ends. Claims read the ``claimable`` column,
which a Work waiting for a dependency never has set. What a dependency's end does to its
dependents is ``_dependents`` (``save_work`` runs it).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.model import Work
from conduit_core.storage._dependents import resolved
from conduit_core.storage._sql import Codec, Cx, save_work

__all__ = ["DependencyPlan", "plan_dependencies"]

#: Ids per ``IN (…)`` list.
_CHUNK = 1_000


class DependencyPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What a submit of ``items`` does about dependencies: each item as it will be stored (or
    the error refusing it), the edges to record, and the existing Work to flag."""

    items: dict[str, Work | ConduitError]
    edges: list[tuple[str, str]] = []
    flag: list[Work] = []

    def write(self, cx: Cx) -> None:
        """Record the edges and flag the existing dependencies (their rows are locked)."""
        for work in self.flag:
            save_work(cx, msgspec.structs.replace(work, has_dependents=True))
        if self.edges:
            cx.many(
                "INSERT INTO conduit_dependency (work_id, depends_on) VALUES (?, ?)", self.edges
            )


def plan_dependencies(cx: Cx, items: Sequence[Work]) -> DependencyPlan | None:
    """Check and link the ``after`` of new Work ``items`` (distinct ids, none stored yet);
    ``None`` when none of them declares any (nothing is read).

    A dependency must be stored Work or another of ``items``; a cycle can only form among
    ``items`` (or by self-reference). Refused items (``dependency_unknown``,
    ``dependency_cycle``) and those depending on them are left out of what is written.
    """
    if not any(w.dependencies is not None and w.dependencies.after for w in items):
        return None
    new = {w.id: w for w in items}
    wanted = sorted({d for w in items if w.dependencies for d in w.dependencies.after} - set(new))
    stored = _lock_existing(cx, wanted)
    decided: dict[str, Work | ConduitError] = {}
    for work in items:
        deps = work.dependencies.after if work.dependencies else []
        if work.id in deps:
            decided[work.id] = ConduitError(
                f"work {work.id!r} cannot run after itself", code="dependency_cycle"
            )
        elif missing := [d for d in deps if d not in new and d not in stored]:
            decided[work.id] = ConduitError(
                f"work {work.id!r} runs after unknown work {missing[0]!r}",
                code="dependency_unknown",
            )
    ended: dict[str, Work] = {w.id: w for w in stored.values() if w.status.terminal}
    edges: list[tuple[str, str]] = []
    flagged: dict[str, Work] = {}
    depended: set[str] = set()
    order, cycles = _batch_order(new)
    for work_id in order:  # dependencies first: a new Work's outcome is known to its dependents
        if work_id in decided:
            continue
        work = new[work_id]
        deps = work.dependencies.after if work.dependencies else []
        if work_id in cycles:
            shown = ", ".join(cycles[work_id])
            decided[work_id] = ConduitError(
                f"work {work_id!r}: its dependencies form a cycle ({shown})",
                code="dependency_cycle",
            )
            continue
        refused = next((d for d in deps if isinstance(decided.get(d), ConduitError)), None)
        if refused is not None:
            cause = decided[refused]
            assert isinstance(cause, ConduitError)
            decided[work_id] = ConduitError(
                f"work {work_id!r} runs after work {refused!r}, refused: {cause.message}",
                code=cause.code,
            )
            continue
        linked = work if work.dependencies is None else _linked(work, ended)
        decided[work_id] = linked
        if linked.status.terminal:
            ended[work_id] = linked
        for dep in linked.dependencies.waiting_for if linked.dependencies else []:
            edges.append((work_id, dep))
            if dep in stored and not stored[dep].has_dependents:
                flagged[dep] = stored[dep]
            depended.add(dep)
    for work_id in depended & set(new):
        depended_on = decided[work_id]
        if isinstance(depended_on, Work):
            decided[work_id] = msgspec.structs.replace(depended_on, has_dependents=True)
    return DependencyPlan(items=decided, edges=edges, flag=list(flagged.values()))


def _batch_order(new: dict[str, Work]) -> tuple[list[str], dict[str, list[str]]]:
    """The ids of ``new`` with each after its dependencies among them (a depth-first post-order,
    iterative: a chain of a thousand costs no stack), and for each id on a cycle, that cycle."""
    order: list[str] = []
    cycles: dict[str, list[str]] = {}
    done: set[str] = set()

    def within(work_id: str) -> list[str]:
        deps = new[work_id].dependencies
        return [d for d in deps.after if d in new] if deps is not None else []

    for root in new:
        if root in done:
            continue
        path = [root]
        todo = [iter(within(root))]
        on_path = {root}
        while todo:
            dep = next(todo[-1], None)
            if dep is None:
                finished = path.pop()
                todo.pop()
                on_path.discard(finished)
                done.add(finished)
                order.append(finished)
            elif dep in on_path:
                ring = path[path.index(dep) :]
                for member in ring:
                    cycles.setdefault(member, ring)
            elif dep not in done:
                path.append(dep)
                on_path.add(dep)
                todo.append(iter(within(dep)))
    return order, cycles


def _lock_existing(cx: Cx, ids: Sequence[str]) -> dict[str, Work]:
    """The stored Work among ``ids``, their rows locked in id order: an end of one of them
    waits for this submit, or this submit sees it ended."""
    found: dict[str, Work] = {}
    for offset in range(0, len(ids), _CHUNK):
        chunk = ids[offset : offset + _CHUNK]
        marks = ", ".join("?" for _ in chunk)
        for (data,) in cx.rows(
            f"SELECT data FROM conduit_work WHERE id IN ({marks}) ORDER BY id FOR UPDATE",
            tuple(chunk),
        ):
            work = Codec.work.decode(data)
            found[work.id] = work
    return found


def _linked(work: Work, ended: dict[str, Work]) -> Work:
    """The new ``work`` with what its dependencies' known outcomes decide: those ended are
    settled now (in ``after`` order), the rest are waited for."""
    assert work.dependencies is not None
    deps = msgspec.structs.replace(work.dependencies, waiting_for=list(work.dependencies.after))
    work = msgspec.structs.replace(work, dependencies=deps)
    for dep in list(deps.after):
        if dep in ended:
            work = resolved(work, ended[dep], work.updated_at_ms)
    return work
