"""The conformance suite's jobs (POSIX sh scripts with checkable side effects) and small helpers."""

from __future__ import annotations

import inspect
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from conduit_core.extension import PhaseOutcome
from conduit_core.model import Event, Work
from conduit_core.runtime import Scheduler

__all__ = ["Jobs", "RecordingCallbacks", "host_pids_alive", "submit", "wait_for"]


class Jobs:
    """Scripts that leave their traces in ``workdir``: one ``side-effects`` line per start."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def _q(self, name: str) -> str:
        return shlex.quote(str(self.workdir / name))

    def record(self) -> str:
        """Starts once (one side-effect line), runs a moment, says it is done, succeeds."""
        return f"echo run >> {self._q('side-effects')}; sleep 0.3; : > {self._q('done')}"

    def fail(self) -> str:
        return f"echo run >> {self._q('side-effects')}; exit 3"

    def until_go(self) -> str:
        """Runs until the test creates ``go``; succeeds then."""
        go = self._q("go")
        return (
            f"echo run >> {self._q('side-effects')}; : > {self._q('ready')}; "
            f"while [ ! -e {go} ]; do sleep 0.05; done; : > {self._q('done')}"
        )

    def stubborn(self) -> str:
        """Ignores TERM and starts a grandchild that ignores it too; says ready once both run."""
        grand, partial = self._q("grandchild.pid"), self._q("grandchild.partial")
        return (
            f"trap '' TERM; echo $$ > {self._q('child.pid')}; "
            f'sh -c "echo \\$\\$ > {partial} && mv {partial} {grand}; exec sleep 600" & '
            f"while [ ! -s {grand} ]; do sleep 0.05; done; : > {self._q('ready')}; "
            "while :; do sleep 1; done"
        )

    def side_effects(self) -> int:
        path = self.workdir / "side-effects"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def ready(self) -> bool:
        return (self.workdir / "ready").exists()

    def done(self) -> bool:
        return (self.workdir / "done").exists()

    def go(self) -> None:
        (self.workdir / "go").touch()

    def pids(self) -> list[int]:
        return [int((self.workdir / n).read_text()) for n in ("child.pid", "grandchild.pid")]


def host_pids_alive(pids: list[int]) -> list[int]:
    """The pids that still name a live (not zombie) process on this host."""
    alive = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        # The state follows the parenthesised command name, which may itself hold spaces.
        if stat.rpartition(")")[2].split()[0] != "Z":
            alive.append(pid)
    return alive


async def wait_for(
    condition: Callable[[], bool | Awaitable[bool]], what: str, seconds: float
) -> None:
    """Poll ``condition`` with a short backoff until it holds or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    delay = 0.01
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")
        await anyio.sleep(delay)
        delay = min(delay * 2, 0.2)


async def submit(sched: Scheduler, binding: str, work_id: str | None = None) -> Work:
    """Submit one Work with an empty first input to ``binding``."""
    now = sched.clock.now_ms()
    work_id = work_id or f"w-{uuid.uuid4().hex[:8]}"
    work = Work(id=work_id, scope="root", binding=binding, created_at_ms=now, updated_at_ms=now)
    first = Event(
        id=f"{work_id}/in1", delivery_id=f"{work_id}/in1", type="input", payload={},
        work_id=work_id, pending=True, accepted_at_ms=now,
    )  # fmt: skip
    return await sched.submit(work, first)


class RecordingCallbacks:
    """In-memory fenced writes, for calling an executor directly outside any scheduler."""

    def __init__(self) -> None:
        self.launch_intent: dict[str, Any] | None = None
        self.recovery: dict[str, Any] | None = None
        self.phases: list[tuple[str, str]] = []
        self.pins: list[str] = []

    async def persist_recovery(self, metadata: Mapping[str, Any]) -> None:
        self.recovery = dict(metadata)

    async def record_launch_intent(self, intent: Mapping[str, Any]) -> None:
        self.launch_intent = dict(intent)

    async def begin_phase(self, name: str) -> None:
        self.phases.append((name, "begin"))

    async def end_phase(self, name: str, outcome: PhaseOutcome) -> None:
        self.phases.append((name, str(outcome)))

    async def pin(self, ref: str) -> None:
        self.pins.append(ref)
