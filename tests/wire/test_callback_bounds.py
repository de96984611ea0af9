"""The daemon's side bounds a real program's callbacks: how many are recorded at once (the reader
stops reading past it), how many one attempt may make, and how fast (docs/wire-protocol.md,
"Bounds on callbacks")."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from conduit_core.extension import ExecutionContext
from conduit_core.remote import CallbackLimits, ProgramSettings, ProgramSupervisor, RemoteExecutor
from conduit_core.testing._jobs import RecordingCallbacks

pytestmark = pytest.mark.anyio

#: Sends SENT phase_begin callbacks for its run as fast as it can, counts the core's replies by
#: kind and code, and reports them in the run's inline result.
FLOODER = r"""
import json, os, struct, sys, threading
SENT = int(sys.argv[1])
#: "callbacks" (the default): phase_begin callbacks; "replies": replies to ids never sent;
#: "late": answers to the handshake again (a request sent, answered already).
WHAT = sys.argv[2] if len(sys.argv) > 2 else "callbacks"
out = os.fdopen(os.dup(1), "wb", buffering=0)
lock = threading.Lock()
replies, done = {}, threading.Event()

def send(message):
    body = json.dumps(message).encode()
    with lock:
        out.write(struct.pack(">I", len(body)) + body)

def read():
    header = sys.stdin.buffer.read(4)
    if len(header) < 4:
        return None
    return json.loads(sys.stdin.buffer.read(struct.unpack(">I", header)[0]))

def flood(rid):
    if WHAT in ("replies", "late"):
        for i in range(1, SENT + 1):
            send({"kind": "replied", "id": 10_000_000 + i if WHAT == "replies" else 1})
        send({"kind": "launched", "id": rid, "handle": "h", "result": {"outcome": "completed"}})
        return
    for i in range(1, SENT + 1):
        send({"kind": "phase_begin", "id": i, "request": rid, "name": "step"})
    done.wait(60)
    summary = " ".join(f"{k}={v}" for k, v in sorted(replies.items()))
    send({"kind": "launched", "id": rid, "handle": "h",
          "result": {"outcome": "completed", "summary": summary}})

while (msg := read()) is not None:
    kind, rid = msg["kind"], msg["id"]
    if kind == "handshake":
        manifest = {"name": "flooder", "generation": 1}
        send({"kind": "handshake_ok", "id": rid, "version": 1, "manifest": manifest})
    elif kind == "run":
        threading.Thread(target=flood, args=(rid,), daemon=True).start()
    elif kind in ("callback_ok", "callback_refused"):
        key = kind if kind == "callback_ok" else msg["error"]["code"]
        replies[key] = replies.get(key, 0) + 1
        if sum(replies.values()) == SENT:
            done.set()
    elif kind == "shutdown":
        send({"kind": "replied", "id": rid})
        break
"""


class _SlowPhases(RecordingCallbacks):
    """A store that takes its time: each phase waits for ``gate``; counts how many wait at once."""

    def __init__(self, full_at: int) -> None:
        super().__init__()
        self.gate = anyio.Event()
        self.full = anyio.Event()  # set once ``full_at`` wait at once
        self.full_at = full_at
        self.active = 0
        self.most = 0

    async def begin_phase(self, name: str) -> None:
        self.active += 1
        self.most = max(self.most, self.active)
        if self.active >= self.full_at:
            self.full.set()
        try:
            await self.gate.wait()
        finally:
            self.active -= 1
        await super().begin_phase(name)


def _flooder(
    tmp_path: Path, sent: int, limits: CallbackLimits, what: str = "callbacks"
) -> RemoteExecutor:
    program = tmp_path / "flooder.py"
    program.write_text(FLOODER)
    settings = ProgramSettings(request_timeout=60, callbacks=limits)
    command = (sys.executable, str(program), str(sent), what)
    supervisor = ProgramSupervisor("flooder", command, expected=None, settings=settings)
    return RemoteExecutor(supervisor, 1, None)


def _ctx(callbacks: Any) -> ExecutionContext:
    fields: Mapping[str, Any] = {
        "execution_id": "x1", "work_id": "w1", "attempt": 1, "epoch": 1, "scope": "root",
        "binding": "b", "executor": "flooder", "generation": 1,
    }  # fmt: skip
    return ExecutionContext(**fields, config={}, env={}, callbacks=callbacks)


async def test_at_most_in_flight_callbacks_are_recorded_at_once_and_the_rest_past_the_count_refused(
    tmp_path: Path,
) -> None:
    limits = CallbackLimits(per_attempt=50, per_second=1_000_000, in_flight=4)
    executor = _flooder(tmp_path, 2_000, limits)
    slow = _SlowPhases(full_at=limits.in_flight)
    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                launched: list[Any] = []

                async def run() -> None:
                    launched.append(await executor.run(_ctx(slow)))

                tg.start_soon(run)
                # The store holds every write: the reader fills the slots, then waits for one.
                await slow.full.wait()
                slow.gate.set()
            handle = launched[0]
            result = await handle.wait()
    finally:
        await executor.supervisor.close()
    assert slow.most == limits.in_flight
    assert len(slow.phases) == limits.per_attempt
    assert result.summary == "callback_limit_exceeded=1950 callback_ok=50"


async def test_callbacks_faster_than_the_rate_are_refused_with_their_code(tmp_path: Path) -> None:
    limits = CallbackLimits(per_attempt=10_000, per_second=20, in_flight=8)
    executor = _flooder(tmp_path, 500, limits)
    recorded = RecordingCallbacks()
    try:
        with anyio.fail_after(60):
            result = await (await executor.run(_ctx(recorded))).wait()
    finally:
        await executor.supervisor.close()
    counts = dict(part.split("=") for part in result.summary.split())
    assert set(counts) == {"callback_ok", "callback_rate_exceeded"}
    # A burst of 20, then about 20 a second while the 500 arrive.
    assert 20 <= int(counts["callback_ok"]) < 200
    assert int(counts["callback_ok"]) + int(counts["callback_rate_exceeded"]) == 500
    assert len(recorded.phases) == int(counts["callback_ok"])


@pytest.mark.parametrize("what", ["callbacks", "replies"])
async def test_refusals_past_their_rate_slow_the_reader_down(what: str, tmp_path: Path) -> None:
    # A refusal writes nothing, but reading it and answering it still costs the daemon's loop,
    # as does a reply nobody asked for: past ``refused_per_second`` the reader waits, so a
    # flooding program gets a bounded share of the daemon's time.
    limits = CallbackLimits(per_attempt=10, per_second=1_000_000, in_flight=8,
                            refused_per_second=1_000)  # fmt: skip
    executor = _flooder(tmp_path, 2_000, limits, what)
    recorded = RecordingCallbacks()
    try:
        with anyio.fail_after(60):
            began = time.monotonic()
            result = await (await executor.run(_ctx(recorded))).wait()
            took = time.monotonic() - began
    finally:
        await executor.supervisor.close()
    if what == "callbacks":
        assert result.summary == "callback_limit_exceeded=1990 callback_ok=10"
        assert len(recorded.phases) == 10
    else:
        assert result.outcome == "completed"
    # ~2,000 refused or dropped at 1,000 a second after a burst of 1,000: about a second at
    # least (read unpaced they take a twentieth of that).
    assert took >= 0.9, took


async def test_late_answers_to_requests_sent_are_not_paced(tmp_path: Path) -> None:
    # A cancelled wait's answer, or a cancel's own, arrives after nobody waits for it: that is the
    # protocol working, not a flood, so it never slows the reader (4,000 of them paced at 1,000 a
    # second would take 3 s at least; read as they come, a tenth of a second).
    limits = CallbackLimits(refused_per_second=1_000)
    executor = _flooder(tmp_path, 4_000, limits, "late")
    try:
        with anyio.fail_after(60):
            began = time.monotonic()
            result = await (await executor.run(_ctx(RecordingCallbacks()))).wait()
            took = time.monotonic() - began
    finally:
        await executor.supervisor.close()
    assert result.outcome == "completed"
    assert took < 1.5, took
