"""What a dependency's end does to the Work waiting for it (``after``), in the transaction that
ends it: ``save_work`` calls :func:`settle_dependents` when it writes a terminal status on a Work
flagged ``has_dependents``, whichever operation ended it (a settlement, a cancel, a gate's
refusal). Nothing is decided in memory or later: a crash leaves both or neither.

This module sits under ``_sql`` (which calls it), so it takes the row reads and writes it needs
as arguments instead of importing them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from conduit_core.model import DependencyFailure, Work, WorkStatus

__all__ = ["DEPENDENCY_FAILED", "resolved", "settle_dependents"]

#: Why a Work whose dependency failed is blocked (``hold``): a person retries or cancels it.
DEPENDENCY_FAILED = "dependency_failed"


class _Rows(Protocol):
    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]: ...

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> None: ...


def resolved(work: Work, dependency: Work, now_ms: int) -> Work:
    """``work`` once ``dependency`` (one it waits for) has ended, by its ``on_failure``."""
    deps = work.dependencies
    assert deps is not None
    left = [d for d in deps.waiting_for if d != dependency.id]
    shrunk = msgspec.structs.replace(deps, waiting_for=left)
    if work.status.terminal:  # already cancelled by another dependency: nothing more to decide
        return msgspec.structs.replace(work, dependencies=shrunk)
    ok = dependency.status is WorkStatus.COMPLETED or deps.on_failure is DependencyFailure.RUN
    if ok:
        return msgspec.structs.replace(work, dependencies=shrunk, updated_at_ms=now_ms)
    failed = msgspec.structs.replace(deps, waiting_for=left, failed=dependency.id)
    if deps.on_failure is DependencyFailure.HOLD:
        return msgspec.structs.replace(
            work, dependencies=failed, blocked_reason=DEPENDENCY_FAILED, updated_at_ms=now_ms
        )
    return msgspec.structs.replace(
        work, dependencies=failed, status=WorkStatus.CANCELLED, retry_timer_id=None,
        updated_at_ms=now_ms,
    )  # fmt: skip


def settle_dependents(
    cx: _Rows,
    dependency: Work,
    decode: Callable[[str], Work],
    write: Callable[[Work], None],
    record: Callable[[Work, Work], None],
) -> None:
    """Settle the Work waiting for ``dependency``, which this transaction has just written
    ended (with ``has_dependents`` cleared); a dependent cancelled by it settles its own
    dependents in turn (a worklist, not recursion: a long chain costs no stack)."""
    todo = [dependency]
    while todo:
        ended = todo.pop()
        rows = cx.rows(
            "SELECT w.data FROM conduit_dependency d JOIN conduit_work w ON w.id = d.work_id "
            "WHERE d.depends_on = ? ORDER BY w.id FOR UPDATE OF w",
            (ended.id,),
        )
        for (data,) in rows:
            work = decode(data)
            if work.dependencies is None or ended.id not in work.dependencies.waiting_for:
                continue
            settled = resolved(work, ended, ended.updated_at_ms)
            if settled.status.terminal and settled.has_dependents:
                settled = msgspec.structs.replace(settled, has_dependents=False)
                todo.append(settled)
            write(settled)
            if settled.dependencies is not None and settled.dependencies.failed == ended.id:
                record(settled, ended)  # its history says why it was cancelled or held
        cx.run("DELETE FROM conduit_dependency WHERE depends_on = ?", (ended.id,))
