"""A test host for the shell executor: contexts whose fenced writes go to a JSON file.

It stands in for the runtime the way a scheduler would use the executor: phases are recorded,
recovery metadata is written durably (so another process can recover from it), and a switch
refuses writes as a lost lease would.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import psutil

from conduit_core.extension import (
    MAX_RECOVERY_METADATA_BYTES,
    ExecutionContext,
    InputEvent,
    LeaseLostError,
    PhaseOutcome,
    Result,
)
from conduit_executors_shell import CURRENT_GENERATION

WAIT_SECONDS = 20.0


class FileCallbacks:
    """AttemptCallbacks that persist recovery metadata to ``metadata_path``."""

    def __init__(self, metadata_path: Path) -> None:
        self.metadata_path = metadata_path
        self.refuse_writes = False
        #: Refuse only the recovery metadata (the launch intent is still recorded).
        self.refuse_metadata = False
        self.launch_intent: dict[str, Any] | None = None
        self.phases: list[tuple[str, str]] = []

    async def persist_recovery(self, metadata: Mapping[str, Any]) -> None:
        if self.refuse_writes or self.refuse_metadata:
            raise LeaseLostError("lease lost (test host refuses writes)")
        encoded = json.dumps(dict(metadata)).encode()
        assert len(encoded) <= MAX_RECOVERY_METADATA_BYTES
        partial = self.metadata_path.with_suffix(".partial")
        partial.write_bytes(encoded)
        partial.replace(self.metadata_path)

    async def record_launch_intent(self, intent: Mapping[str, Any]) -> None:
        if self.refuse_writes:
            raise LeaseLostError("lease lost (test host refuses writes)")
        self.launch_intent = dict(intent)
        # Durable too, so another process can discover the launch by it.
        self.intent_path.write_text(json.dumps(self.launch_intent))

    @property
    def intent_path(self) -> Path:
        return self.metadata_path.with_name(f"{self.metadata_path.stem}.intent.json")

    def recorded_intent(self) -> dict[str, Any] | None:
        if not self.intent_path.exists():
            return None
        data: dict[str, Any] = json.loads(self.intent_path.read_bytes())
        return data

    async def begin_phase(self, name: str) -> None:
        self.phases.append((name, "begin"))

    async def end_phase(self, name: str, outcome: PhaseOutcome) -> None:
        self.phases.append((name, outcome.value))

    async def pin(self, ref: str) -> None:
        raise AssertionError("the shell executor pins nothing")

    def recorded(self) -> dict[str, Any] | None:
        if not self.metadata_path.exists():
            return None
        data: dict[str, Any] = json.loads(self.metadata_path.read_bytes())
        return data


def new_execution_id() -> str:
    return f"exec-{uuid.uuid4().hex[:12]}"


def make_context(
    tmp_path: Path,
    config: Mapping[str, Any],
    *,
    execution_id: str | None = None,
    generation: int = CURRENT_GENERATION,
    epoch: int = 1,
    inputs: Sequence[InputEvent] = (),
    env: Mapping[str, str] | None = None,
    recovery: Mapping[str, Any] | None = None,
    launch_intent: Mapping[str, Any] | None = None,
    deadline_ms: int | None = None,
    callbacks: FileCallbacks | None = None,
    state_dir: Path | None = None,
) -> tuple[ExecutionContext, FileCallbacks]:
    callbacks = callbacks or FileCallbacks(tmp_path / "recovery.json")
    ctx = ExecutionContext(
        execution_id=execution_id or new_execution_id(),
        work_id="work-1",
        attempt=1,
        epoch=epoch,
        scope="root",
        binding="job",
        executor="shell",
        generation=generation,
        config=config,
        inputs=inputs,
        env=env,
        deadline_ms=deadline_ms,
        recovery=recovery,
        launch_intent=launch_intent,
        state_dir=str(state_dir or tmp_path / "state"),
        callbacks=callbacks,
    )
    return ctx, callbacks


def tagged_processes(execution_id: str) -> list[psutil.Process]:
    """Live processes carrying the execution's tag, found independently of the executor."""
    found = []
    for process in psutil.process_iter(["status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if process.environ().get("CONDUIT_EXECUTION_ID") == execution_id:
                found.append(process)
        except psutil.Error:
            continue
    return found


def is_running(pid: int) -> bool:
    """True when ``pid`` is a live (not zombie) process."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until(condition: Callable[[], bool], what: str, seconds: float = WAIT_SECONDS) -> None:
    """Poll ``condition`` with a short backoff until it holds or the deadline passes."""
    deadline = time.monotonic() + seconds
    delay = 0.005
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


async def wait_until_async(
    condition: Callable[[], bool], what: str, seconds: float = WAIT_SECONDS
) -> None:
    deadline = time.monotonic() + seconds
    delay = 0.005
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        await anyio.sleep(delay)
        delay = min(delay * 2, 0.1)


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def pid_from_file(path: Path) -> int:
    return int(path.read_text().strip())


def env_without_conduit() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}


def text(path: str | Path) -> str:
    """A file's text (a plain helper, so async tests need no pathlib call of their own)."""
    return Path(path).read_text()


def artifact_text(result: Result, name: str) -> str:
    return text(next(a.ref for a in result.artifacts if a.name == name))
