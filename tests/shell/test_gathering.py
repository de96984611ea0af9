"""``GatheredLooks``: questions asked together share one look, a question asked during a look
waits for the next, and no cancellation strands another caller. The wrapper checks and the
process census are both built on it (their own tests check what each asks and answers)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.to_thread
import pytest

from conduit_executors_shell._gathering import GatheredLooks
from tests.shell._harness import wait_until_async

pytestmark = pytest.mark.anyio


class _BlockingLook:
    """A look that records each batch and, while ``hold`` is set, blocks until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, questions: Sequence[int]) -> list[int]:
        self.batches.append(list(questions))
        if self.hold:
            self.entered.set()
            self.release.wait(10)
        return [q * 10 for q in questions]


async def test_a_question_asked_during_a_look_waits_for_the_next_and_cancelling_strands_no_one() -> (
    None
):
    look = _BlockingLook()
    look.hold = True
    gathered: GatheredLooks[int, int] = GatheredLooks(look)
    answers: dict[int, int | None] = {}

    async def ask(question: int) -> None:
        answers[question] = await gathered.ask(question)

    leader = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_in_scope, leader, ask, 1)
        await anyio.to_thread.run_sync(look.entered.wait, 10)
        # Asked while the first look runs: answered by a later look, never by that one.
        late = anyio.CancelScope()
        tg.start_soon(_in_scope, late, ask, 2)
        tg.start_soon(ask, 3)
        await wait_until_async(lambda: len(gathered._waiting) == 2, "both questions to wait")
        late.cancel()  # a waiting question leaves; the others still get their look
        leader.cancel()  # the leader's look is shielded: it still answers the batch
        look.hold = False
        look.release.set()
    assert look.batches == [[1], [3]]
    assert answers[3] == 30
    assert 2 not in answers
    assert not gathered._looking
    assert (gathered.looks, gathered.asked) == (2, 2)


async def _in_scope(scope: anyio.CancelScope, ask: Any, question: int) -> None:
    with scope:
        await ask(question)
