"""Questions asked at the same time, answered by one look: one thread hop for many callers.

``WrapperChecks`` (is each wrapper still that very process?) and ``ProcessCensus`` (which live
processes does each scan want?) both read ``/proc`` for dozens of jobs at once after a restart
or a mass stop. ``GatheredLooks`` is what they share: the first caller leads, yields once so the
questions asked in the same pass of the event loop join, then looks for all of them in one thread
hop; questions asked meanwhile wait, and the first of them leads the next look. A look starts only
after every question it answers was asked, so no answer comes from a reading taken before its
caller asked. A leader's look is shielded (one bounded read of ``/proc``), so cancelling one
caller never leaves the others without an answer. A look that fails, or answers the wrong number
of questions, answers ``None`` to each: the caller then takes its single-job path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

__all__ = ["GatheredLooks"]

Q = TypeVar("Q")
A = TypeVar("A")


class _Question(Generic[Q, A]):
    def __init__(self, question: Q) -> None:
        self.question = question
        self.answer: A | None = None
        self.leads = False
        self.answered = anyio.Event()


class GatheredLooks(Generic[Q, A]):
    """Answers questions with ``look`` (run in a worker thread), many per call."""

    def __init__(self, look: Callable[[Sequence[Q]], Sequence[A]]) -> None:
        self._look = look
        self._waiting: list[_Question[Q, A]] = []
        self._looking = False
        #: How many looks answered how many questions (the benches and tests read them).
        self.looks = 0
        self.asked = 0

    async def ask(self, question: Q) -> A | None:
        """The look's answer to ``question``; ``None`` when the look failed."""
        asking: _Question[Q, A] = _Question(question)
        self._waiting.append(asking)
        if self._looking:
            try:
                await asking.answered.wait()
            except BaseException:
                if asking in self._waiting:
                    self._waiting.remove(asking)
                if asking.leads:
                    self._hand_over()
                raise
            if not asking.leads:
                return asking.answer
        self._looking = True
        with anyio.CancelScope(shield=True):
            await anyio.lowlevel.checkpoint()  # the questions asked in this pass join this look
            batch, self._waiting = self._waiting, []
            answers: Sequence[A | None] = [None] * len(batch)
            try:
                looked = await anyio.to_thread.run_sync(self._look, [q.question for q in batch])
                if len(looked) == len(batch):
                    answers = looked
            except Exception:
                pass
            finally:
                # Whatever happened, every question of the batch is answered and the next look led.
                self.looks += 1
                self.asked += len(batch)
                for waiting, answer in zip(batch, answers, strict=True):
                    waiting.answer = answer
                    waiting.answered.set()
                self._hand_over()
        return asking.answer

    def _hand_over(self) -> None:
        if self._waiting:
            following = self._waiting[0]
            following.leads = True
            following.answered.set()
        else:
            self._looking = False
