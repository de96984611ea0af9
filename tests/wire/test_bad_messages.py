"""Bad messages, both ways: every message type refused by a coded error naming its field, and a
misbehaving real program never takes the daemon's side down (nor a bad core message the SDK's).
"""

from __future__ import annotations

import asyncio
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from conduit_core.errors import PluginLoadError
from conduit_core.extension import (
    ExecutionContext,
    LostSightError,
    OperationError,
    StopTarget,
    wire,
)
from conduit_core.plugins import Plugins
from conduit_core.remote import ProgramSettings, ProgramSpec, ProgramSupervisor, RemoteExecutor
from conduit_core.testing._jobs import RecordingCallbacks
from tests.shell._harness import wait_until_async

HERE = Path(__file__).resolve().parent
CTX = {
    "execution_id": "x1", "work_id": "w1", "attempt": 1, "epoch": 1, "scope": "root",
    "binding": "b", "executor": "rogue", "generation": 1,
}  # fmt: skip
TARGET = {"execution_id": "x1", "epoch": 1, "work_id": "w1", "generation": 1}
RESULT = {"outcome": "completed"}

#: kind -> (a valid message, the same with one field made wrong, the path the error names)
EXECUTOR_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "handshake_ok": ({"version": 1, "manifest": {"name": "x", "generation": 1}},
                     {"manifest": {"name": "x", "generation": 0}}, "$.manifest.generation"),
    "launched": ({"handle": "h"}, {"handle": 12}, "$.handle"),
    "finished": ({"result": RESULT}, {"result": {"outcome": "bogus"}}, "$.result.outcome"),
    "stopped": ({"verified": True}, {"verified": "yes"}, "$.verified"),
    "output_text": ({"text": "tail"}, {"text": 5}, "$.text"),
    "replied": ({}, {"id": 0}, "$.id"),
    "failed": ({"error": {"code": "x"}}, {"error": {"code": "Bad Code"}}, "$.error.code"),
    "launch_intent": ({"request": 1, "intent": {}}, {"intent": "s"}, "$.intent"),
    "persist_recovery": ({"request": 1, "metadata": {}}, {"metadata": []}, "$.metadata"),
    "phase_begin": ({"request": 1, "name": "workspace"}, {"name": ""}, "$.name"),
    "phase_end": ({"request": 1, "name": "workspace", "outcome": "ok"}, {"outcome": "meh"},
                  "$.outcome"),
    "pin": ({"request": 1, "ref": "c1"}, {"ref": ""}, "$.ref"),
}  # fmt: skip
CORE_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "handshake": ({"min_version": 1, "max_version": 1}, {"min_version": "1"}, "$.min_version"),
    "run": ({"context": CTX}, {"context": {**CTX, "epoch": "x"}}, "$.context.epoch"),
    "resume": ({"context": CTX, "wake": {"id": "e", "type": "t"}}, {"wake": 3}, "$.wake"),
    "recover": ({"context": CTX}, {"context": []}, "$.context"),
    "wait": ({"handle": "h"}, {"handle": ""}, "$.handle"),
    "stop": ({"target": TARGET}, {"target": {**TARGET, "generation": "g"}},
             "$.target.generation"),
    "interrupt": ({"target": TARGET}, {"target": None}, "$.target"),
    "inject": ({"target": TARGET, "inputs": []}, {"inputs": {}}, "$.inputs"),
    "output": ({"target": TARGET, "stream": "stdout", "max_bytes": 10},
               {"max_bytes": 1 << 20}, "$.max_bytes"),
    "cancel": ({"request": 1}, {"request": 0}, "$.request"),
    "shutdown": ({}, {"id": "1"}, "$.id"),
    "callback_ok": ({}, {"id": -1}, "$.id"),
    "lease_lost": ({"message": "m"}, {"message": 5}, "$.message"),
    "callback_refused": ({"error": {"code": "x"}}, {"error": {}}, "$.error"),
}  # fmt: skip


def _kinds(types: tuple[type[msgspec.Struct], ...]) -> set[str]:
    return {str(t.__struct_config__.tag) for t in types}


def test_the_cases_cover_every_message_type() -> None:
    assert set(EXECUTOR_CASES) == _kinds(wire.EXECUTOR_MESSAGES)
    assert set(CORE_CASES) == _kinds(wire.CORE_MESSAGES)


def _body(kind: str, fields: dict[str, Any], **over: Any) -> bytes:
    return msgspec.json.encode({"kind": kind, "id": 5, **fields, **over})


@pytest.mark.parametrize("kind", sorted(EXECUTOR_CASES))
def test_each_executor_message_refused_naming_its_field(kind: str) -> None:
    good, bad, path = EXECUTOR_CASES[kind]
    wire.decode_executor_message(_body(kind, good))  # positive control: the valid one decodes
    with pytest.raises(wire.WireProtocolError) as caught:
        wire.decode_executor_message(_body(kind, good, **bad))
    assert caught.value.code == "wire_invalid_message"
    assert f"`{path}`" in caught.value.message


@pytest.mark.parametrize("kind", sorted(CORE_CASES))
def test_each_core_message_refused_naming_its_field(kind: str) -> None:
    good, bad, path = CORE_CASES[kind]
    wire.decode_core_message(_body(kind, good))
    with pytest.raises(wire.WireProtocolError) as caught:
        wire.decode_core_message(_body(kind, good, **bad))
    assert caught.value.code == "wire_invalid_message"
    assert f"`{path}`" in caught.value.message


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"kind":"teleported","id":3}', "wire_unknown_message"),
        (b'{"id":3}', "wire_unknown_message"),
        (b"[1, 2]", "wire_malformed"),
        (b"\xff not json", "wire_malformed"),
        (b"[" * 5000 + b"]" * 5000, "wire_malformed"),
    ],
)
def test_unknown_and_malformed_messages_have_codes(body: bytes, code: str) -> None:
    for decode in (wire.decode_core_message, wire.decode_executor_message):
        with pytest.raises(wire.WireProtocolError) as caught:
            decode(body)
        assert caught.value.code == code


# --- the daemon's side against a real misbehaving program ---------------------------------------


def _rogue(mode: str) -> RemoteExecutor:
    settings = ProgramSettings(
        handshake_timeout=30, request_timeout=3, backoff_initial=0.05, backoff_max=0.2
    )
    command = (sys.executable, str(HERE / "_rogue_program.py"), mode)
    supervisor = ProgramSupervisor("rogue", command, expected=None, settings=settings)
    return RemoteExecutor(supervisor, 1, None)


def _ctx(callbacks: RecordingCallbacks, *, epoch: int = 1) -> ExecutionContext:
    return ExecutionContext(
        **(CTX | {"epoch": epoch}), config={}, env={"TOKEN": "s3cret"}, callbacks=callbacks
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("mode", "code", "text"),
    [
        ("unknown_kind", "wire_unknown_message", "teleported"),
        ("bad_field", "wire_invalid_message", "$.handle"),
        ("bad_callback", "reported", "$.intent"),
        # Ids a dynamic language turned into strings: refused naming `$.id`, and the error
        # still reaches the request (or the program, for a callback) instead of a timeout.
        ("string_id", "wire_invalid_message", "`$.id`"),
        ("string_callback_id", "reported", "callback_refused:executor 'rogue' sent an invalid "
         "message (wire_invalid_message): invalid message: Expected `int`, got `str` - at `$.id`"),
    ],
)
async def test_an_invalid_reply_fails_its_request_and_the_program_stays(
    mode: str, code: str, text: str
) -> None:
    executor = _rogue(mode)
    try:
        with pytest.raises(OperationError) as caught:
            await executor.run(_ctx(RecordingCallbacks()))
        assert caught.value.code == code
        assert text in caught.value.message
        state = executor.supervisor.state()
        assert state["restarts"] == 0
        assert state["status"] == "running"
        # The same program still answers: the stream was kept.
        evidence = await executor.stop(StopTarget(execution_id="x1", epoch=1, work_id="w1"))
        assert evidence.verified
        assert executor.supervisor.state()["pid"] == state["pid"]
    finally:
        await executor.supervisor.close()


@pytest.mark.anyio
async def test_a_result_with_a_reserved_unit_is_refused_on_receipt() -> None:
    executor = _rogue("bad_result")
    try:
        handle = await executor.run(_ctx(RecordingCallbacks()))
        with pytest.raises(OperationError) as caught:
            await handle.wait()
        assert caught.value.code == "invalid_result"
        assert "usage.units.turns" in caught.value.message
    finally:
        await executor.supervisor.close()


@pytest.mark.anyio
async def test_a_wait_on_a_forgotten_handle_follows_the_segment_through_recovery() -> None:
    # A program may answer a wait the core had cancelled and forget the handle: the next wait's
    # unknown_handle hands the attempt to recovery (the core's, at the next epoch), whose
    # recover finds it (here: finished).
    executor = _rogue("forgetful")
    try:
        handle = await executor.run(_ctx(RecordingCallbacks()))
        with pytest.raises(LostSightError) as lost:
            await handle.wait()
        assert lost.value.code == "executor_lost"
        assert "no longer knows the attempt's handle" in lost.value.message
        recovered = await executor.recover(_ctx(RecordingCallbacks(), epoch=2))
        result = await recovered.wait()
        assert result.summary == "found again"
        assert executor.supervisor.state()["restarts"] == 0
    finally:
        await executor.supervisor.close()


@pytest.mark.anyio
async def test_a_wait_cancelled_as_its_program_dies_ends_cancelled() -> None:
    # The core cancels a wait (its quick window ended) in the moment the program died: its stdin
    # is closed but its reader has not yet seen the end. The cancel sent on the way out finds no
    # program; the wait still ends cancelled, so the core's next wait hands the attempt to
    # recovery instead of failing it with the program's end as an executor error.
    executor = _rogue("silent_wait")
    try:
        handle = await executor.run(_ctx(RecordingCallbacks()))
        waiting = asyncio.ensure_future(handle.wait())
        conn = executor.supervisor._conn
        assert conn is not None
        await wait_until_async(lambda: bool(conn._pending), "the wait to be sent")
        conn.process.stdin.close()  # as after a kill -9, before the reader sees its output end
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        with pytest.raises(LostSightError):
            await handle.wait()
    finally:
        await executor.supervisor.close()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("oversized", "wrote garbage"),
        ("not_json", "wrote garbage"),
        ("exit", "exited"),
        ("hang", "did not answer within"),
    ],
)
async def test_a_dead_hung_or_garbage_writing_program_is_restarted_into_recovery(
    mode: str, why: str
) -> None:
    executor = _rogue(mode)
    try:
        # Lost mid-launch: handed to recovery, never failed into a rerun ...
        with pytest.raises(LostSightError):
            await executor.run(_ctx(RecordingCallbacks()))
        # ... which asks the restarted program, at the next epoch, what runs; this one cannot
        # tell, which the core turns into a hold.
        with pytest.raises(OperationError) as caught:
            await executor.recover(_ctx(RecordingCallbacks(), epoch=2))
        assert caught.value.code == "cannot_tell"
        state = executor.supervisor.state()
        assert state["restarts"] >= 1
        assert why in state["last_error"]
        assert "s3cret" not in state["last_error"]
    finally:
        await executor.supervisor.close()


@pytest.mark.parametrize(
    ("mode", "names"), [("version", "speaks protocol version 2"), ("refuse_version", "7..9")]
)
def test_a_protocol_version_mismatch_refuses_the_plugin_at_load(mode: str, names: str) -> None:
    spec = ProgramSpec(command=(sys.executable, str(HERE / "_rogue_program.py"), mode))
    with pytest.raises(PluginLoadError) as caught:
        Plugins.load(programs={"rogue": spec})
    assert caught.value.code == "wire_version_mismatch"
    assert names in caught.value.message
    assert "1..1" in caught.value.message
    assert "[executors.rogue]" in caught.value.message


# --- the program's side (the SDK) against bad core messages -------------------------------------


class _Program:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_sdk_program.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip

    def send(self, body: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(wire.HEADER.pack(len(body)) + body)
        self.proc.stdin.flush()

    def read(self, seconds: float = 30) -> wire.ExecutorMessage:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + seconds

        def exactly(n: int) -> bytes:
            data = b""
            while len(data) < n:
                left = deadline - time.monotonic()
                assert left > 0, "no reply in time"
                assert select.select([fd], [], [], left)[0], "no reply in time"
                chunk = self.proc.stdout.read1(n - len(data))  # type: ignore[union-attr]
                assert chunk, f"the program exited ({self.proc.poll()})"
                data += chunk
            return data

        length = wire.frame_length(exactly(wire.HEADER.size))
        return wire.decode_executor_message(exactly(length))


def test_the_sdk_answers_every_bad_core_message_and_keeps_serving() -> None:
    program = _Program()
    try:
        program.send(_body("handshake", CORE_CASES["handshake"][0]))
        assert isinstance(program.read(), wire.HandshakeOk)
        for kind, (good, bad, path) in sorted(CORE_CASES.items()):
            program.send(_body(kind, good, **bad))
            if kind in ("callback_ok", "lease_lost", "callback_refused") or "id" in bad:
                continue  # no request of that id waits: nothing to answer
            reply = program.read()
            assert isinstance(reply, wire.RequestFailed), kind
            assert reply.error.code == "wire_invalid_message", kind
            assert f"`{path}`" in reply.error.message, kind
        program.send(b'{"kind":"teleported","id":77}')
        reply = program.read()
        assert isinstance(reply, wire.RequestFailed)
        assert reply.error.code == "wire_unknown_message"
        # Still serving: a run goes through its fenced callback, and the typed data is checked.
        program.send(_body("run", {"context": {**CTX, "executor": "instant"}}, id=90))
        callback = program.read()
        assert isinstance(callback, wire.RecordLaunchIntent)
        program.send(msgspec.json.encode(wire.CallbackOk(id=callback.id)))
        launched = program.read()
        assert isinstance(launched, wire.Launched)
        program.send(msgspec.json.encode(wire.Wait(id=91, handle=launched.handle)))
        finished = program.read()
        assert isinstance(finished, wire.RequestFailed)
        assert finished.error.code == "invalid_result"
        assert "`$.data.n`" in finished.error.message
        program.send(msgspec.json.encode(wire.Shutdown(id=92)))
        assert isinstance(program.read(), wire.Replied)
        assert program.proc.wait(timeout=30) == 0
    finally:
        if program.proc.poll() is None:
            program.proc.kill()
        program.proc.wait()
        for pipe in (program.proc.stdin, program.proc.stdout):
            if pipe is not None:
                pipe.close()
