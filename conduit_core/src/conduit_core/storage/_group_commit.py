"""Group commit: concurrent writes share one transaction (and one disk sync).

Each write is an operation (a function of the transaction's cursor). A caller that finds fewer
than ``max_parallel`` batches running becomes a leader: it first lets the other tasks ready in
the same turn of the event loop queue theirs, then takes every queued operation (up to
``max_batch``) and runs them in one transaction in a worker thread (``StoreThreads``), where one
operation's refusal (a lost lease, say) rolls back only that operation (``run_batch``:
``SqlStore`` reruns such a batch with a savepoint per operation). The others wait and are woken
with their own result: every operation of a batch waits on the batch's one event, set when the
batch ends, so a write costs no event of its own. A driver error (busy, serialization
failure) is the whole transaction's: the backend retries the batch, which reruns every
operation against the fresh state, so the outcome is as if each had run in its own transaction,
one after another.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, Generic, TypeVar

import anyio
import anyio.lowlevel

from conduit_core.storage._threads import StoreThreads
from conduit_core.telemetry import METRICS

__all__ = ["GroupCommit", "Operation"]

T = TypeVar("T")


class Operation(Generic[T]):
    """One caller's write, its outcome, and the event that wakes the caller (shared with the
    other operations queued or batched with it)."""

    __slots__ = (
        "alone_of_kind", "error", "finished", "fn", "kind", "later", "order", "result",
        "savepoint", "shared", "taken", "wakeup",
    )  # fmt: skip

    def __init__(
        self,
        fn: Callable[[Any], T],
        *,
        shared: bool = False,
        order: str = "",
        savepoint: bool = True,
        later: Callable[[Any], Callable[[], T]] | None = None,
        kind: str = "",
        alone_of_kind: bool = False,
    ) -> None:
        self.fn = fn
        #: With ``alone_of_kind``, the operation shares its batch with no other operation of
        #: its ``kind`` (``""``: no kind); the next waits for the next batch. The backend's
        #: reason: claims each lock their limits in one order, and a claim of named Work and
        #: another claim in one transaction would lock two sets in the order they came.
        self.kind = kind
        self.alone_of_kind = alone_of_kind
        #: ``fn`` in two steps, if it has them: send its statements, then take its outcome
        #: (the backend may send a whole batch's first steps together; see ``SqlStore``).
        self.later = later
        #: Whether a refusal may come after a write, so the operation needs its own savepoint
        #: in a shared batch (false: it writes nothing before every check has passed).
        self.savepoint = savepoint
        #: Safe to run beside other writers (it row-locks what it needs); see the backend.
        self.shared = shared
        #: Row-locked operations of a batch run sorted by this (the row they lock first), so
        #: two batches lock their common rows in one order and cannot deadlock on them.
        self.order = order
        self.result: T | None = None
        self.error: BaseException | None = None
        self.taken = False
        self.finished = False
        #: Set when the batch this operation is in ends (or, while queued, when it is to lead).
        self.wakeup: anyio.Event | None = None


def _timed(run_batch: Callable[[list[Operation[Any]]], None], batch: list[Operation[Any]]) -> None:
    """``run_batch(batch)`` in the store thread, its time counted: with each write's latency
    (``store_write``) it tells a store that is busy from one waited on through hops."""
    started = time.perf_counter()
    try:
        run_batch(batch)
    finally:
        METRICS.store_batch_ran(time.perf_counter() - started)


class GroupCommit:
    """Batches operations into transactions run by ``run_batch`` (blocking, in a thread)."""

    def __init__(
        self,
        run_batch: Callable[[list[Operation[Any]]], None],
        *,
        threads: StoreThreads,
        max_parallel: int = 1,
        max_batch: int = 128,
    ) -> None:
        self._run_batch = run_batch
        self._threads = threads
        self._max_parallel = max_parallel
        self._max_batch = max_batch
        self._queue: deque[Operation[Any]] = deque()
        #: What every queued operation waits on: a leader takes it with the batch it takes.
        self._queued_wakeup = anyio.Event()
        self._running = 0
        #: A caller is letting the loop's turn queue more writes before it leads them.
        self._gathering = False

    async def submit(
        self,
        fn: Callable[[Any], T],
        *,
        shared: bool = False,
        order: str = "",
        savepoint: bool = True,
        later: Callable[[Any], Callable[[], T]] | None = None,
        kind: str = "",
        alone_of_kind: bool = False,
    ) -> T:
        op: Operation[T] = Operation(
            fn, shared=shared, order=order, savepoint=savepoint, later=later, kind=kind,
            alone_of_kind=alone_of_kind,
        )  # fmt: skip
        submitted = time.perf_counter()
        self._queue.append(op)
        op.wakeup = self._queued_wakeup
        try:
            while not op.finished:
                # An operation another leader has taken is that leader's to finish (it wakes
                # us): leading now would find the queue empty and spin without yielding. A
                # caller already gathering a batch will take this one too.
                if not op.taken and self._running < self._max_parallel and not self._gathering:
                    # Let every task already woken this turn of the loop queue its write first
                    # (an attempt's end wakes several): they then share this batch instead of
                    # each leading a transaction of one. They wait for it meanwhile, without a
                    # turn of the loop each.
                    self._gathering = True
                    try:
                        await anyio.lowlevel.checkpoint()
                    finally:
                        self._gathering = False
                    if op.taken or self._running >= self._max_parallel:
                        continue  # another caller led meanwhile
                    await self._lead()
                else:
                    # Woken unfinished: the lead was handed over, or this operation was left
                    # queued behind a full batch (and now waits on the queue's new event).
                    await op.wakeup.wait()
        except BaseException:
            if not op.taken:
                self._queue.remove(op)  # never ran, never will
                if self._queue and self._running < self._max_parallel:
                    # It may have been gathering: those queued meanwhile wait for a leader.
                    self._requeue().set()
            raise
        METRICS.store_write(time.perf_counter() - submitted)
        if op.error is not None:
            raise op.error
        return op.result  # type: ignore[return-value]

    async def _lead(self) -> None:
        self._running += 1
        try:
            while self._queue:
                batch = self._take_batch()
                # The batch's operations all wait on the queue's event: it is now the batch's.
                ended = self._requeue()
                for op in batch:
                    op.taken = True
                METRICS.store_batch(len(batch))
                # The batch's writes commit (or not) as a whole whatever happens to this task:
                # ``StoreThreads.run`` is shielded, so every caller in it gets its outcome.
                try:
                    await self._threads.run(partial(_timed, self._run_batch, batch))
                except BaseException as exc:
                    for op in batch:
                        if not op.finished:
                            op.error = exc
                for op in batch:
                    op.finished = True
                ended.set()
                await anyio.lowlevel.checkpoint_if_cancelled()
        finally:
            self._running -= 1
            if self._queue and self._running < self._max_parallel:
                self._requeue().set()  # hand the lead to the queued: the first awake leads

    def _take_batch(self) -> list[Operation[Any]]:
        """The next batch, in queue order: at most ``max_batch`` operations, and none that must
        be alone of its kind beside another of that kind (those stay queued, in their order)."""
        if not any(op.alone_of_kind for op in self._queue):
            return [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
        batch: list[Operation[Any]] = []
        left: list[Operation[Any]] = []
        kinds: dict[str, bool] = {}  # per kind in the batch: whether one must be alone
        while self._queue and len(batch) < self._max_batch:
            op = self._queue.popleft()
            if op.kind:
                held = kinds.get(op.kind)
                if held is not None and (held or op.alone_of_kind):
                    left.append(op)
                    continue
                kinds[op.kind] = op.alone_of_kind
            batch.append(op)
        self._queue.extendleft(reversed(left))
        return batch

    def _requeue(self) -> anyio.Event:
        """Give the queue a new event to wait on; the old one, returned, is the caller's."""
        old, self._queued_wakeup = self._queued_wakeup, anyio.Event()
        for op in self._queue:  # left behind a full batch (rare): they wait on the new one
            op.wakeup = self._queued_wakeup
        return old
