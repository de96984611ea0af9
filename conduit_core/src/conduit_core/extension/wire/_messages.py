"""Every message of the executor wire protocol, as msgspec Structs (docs/wire-protocol.md).

The daemon ("core") starts an executor program and talks to it over the program's stdin and
stdout: each message is one frame, a 4-byte big-endian length followed by that many bytes of
UTF-8 JSON. Every message is an object whose ``kind`` names its type (tagged unions), so an
unknown or misspelt message is refused by its ``$.kind`` rather than half-understood.

Two id spaces: the core numbers its requests (``id``) and the program answers each with exactly
one reply carrying the same ``id``; the program numbers its callbacks (``id``) and the core
answers each with exactly one callback reply. Requests are multiplexed: many may be in flight at
once and replies come in any order. The JSON Schema of these structs is kept in
``manifests/wire-protocol.schema.json`` (``python -m conduit_core.extension.wire.schema``).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from conduit_core.extension._executor import Capability, InputEvent, PhaseOutcome
from conduit_core.extension._results import Result, RetryHint

__all__ = [
    "CORE_MESSAGES",
    "EXECUTOR_MESSAGES",
    "MAX_FRAME_BYTES",
    "MAX_OUTPUT_BYTES",
    "PROTOCOL_VERSION",
    "AttemptContext",
    "CallbackOk",
    "CallbackRefused",
    "Cancel",
    "CoreMessage",
    "ExecutorMessage",
    "Finished",
    "Handshake",
    "HandshakeOk",
    "Inject",
    "Interrupt",
    "Launched",
    "LeaseLost",
    "Output",
    "OutputText",
    "Pin",
    "PersistRecovery",
    "PhaseBegin",
    "PhaseEnd",
    "RecordLaunchIntent",
    "Recover",
    "Replied",
    "RequestFailed",
    "Resume",
    "Run",
    "Shutdown",
    "Stop",
    "Stopped",
    "Target",
    "Wait",
    "WireError",
    "WireManifest",
    "wire_json_schema",
]

#: The protocol version this conduit speaks (the handshake agrees on one version).
PROTOCOL_VERSION = 1
#: A frame larger than this (either way) is refused; results and configs are far smaller.
MAX_FRAME_BYTES = 1024 * 1024
#: The most output one ``output`` request asks for: escaped as JSON it still fits in a frame.
MAX_OUTPUT_BYTES = 128 * 1024

RequestId = Annotated[int, msgspec.Meta(ge=1, le=2**53 - 1)]
Name = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]
Generation = Annotated[int, msgspec.Meta(ge=1)]
HandleId = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Text = Annotated[str, msgspec.Meta(max_length=4096)]


class _Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    pass


# --- shared parts -------------------------------------------------------------------------------


class WireManifest(msgspec.Struct, frozen=True, kw_only=True):
    """The executor as the program declares it in the handshake."""

    name: Name
    generation: Generation
    pool: Name | None = None
    historical_generations: list[Generation] = []
    capabilities: list[Capability] = []
    description: Text = ""
    #: JSON Schema of the binding's ``config`` table (shown to operators; the program checks it).
    config_schema: dict[str, Any] | None = None
    #: JSON Schema of ``Result.data``; the program validates its results against its type and the
    #: core checks each result it receives against the schema's required fields and types.
    result_data_schema: dict[str, Any] | None = None


class AttemptContext(msgspec.Struct, frozen=True, kw_only=True):
    """What ``run``, ``resume`` and ``recover`` hand the executor (``ExecutionContext``)."""

    execution_id: str
    work_id: str
    attempt: int
    epoch: int
    scope: str
    binding: str
    executor: str
    generation: int
    config: dict[str, Any] = {}
    inputs: list[InputEvent] = []
    #: The run environment: only in ``run`` and ``resume``; never logged, never persisted.
    env: dict[str, str] = {}
    deadline_ms: int | None = None
    recovery: dict[str, Any] | None = None
    launch_intent: dict[str, Any] | None = None
    state_dir: str | None = None

    def __repr__(self) -> str:  # never show env: it may hold secrets
        return (
            f"AttemptContext(execution_id={self.execution_id!r}, epoch={self.epoch}, "
            f"executor={self.executor!r}, generation={self.generation})"
        )


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """Which attempt a stop, interrupt or inject is for (``StopTarget`` plus the generation)."""

    execution_id: str
    epoch: int
    work_id: str
    generation: int
    config: dict[str, Any] = {}
    recovery: dict[str, Any] | None = None
    #: With no ``recovery`` (the launch stopped between the two), what finds exactly its
    #: resources; ``state_dir`` is the executor's directory on this host.
    launch_intent: dict[str, Any] | None = None
    state_dir: str | None = None


class WireError(msgspec.Struct, frozen=True, kw_only=True):
    """A coded ``OperationError``; ``not_started``, ``resources_gone`` and ``not_accepting``
    carry the meanings of the contract's errors of the same codes."""

    code: Name
    message: Text = ""
    permanent: bool = False
    retry_hint: RetryHint | None = None


# --- core -> executor: requests -----------------------------------------------------------------


class Handshake(_Message, frozen=True, kw_only=True, tag="handshake"):
    """First request: the versions the core speaks. Answered by ``handshake_ok`` or an error."""

    id: RequestId
    min_version: int
    max_version: int


class Run(_Message, frozen=True, kw_only=True, tag="run"):
    id: RequestId
    context: AttemptContext


class Resume(_Message, frozen=True, kw_only=True, tag="resume"):
    id: RequestId
    context: AttemptContext
    wake: InputEvent


class Recover(_Message, frozen=True, kw_only=True, tag="recover"):
    """Answered by ``launched``, or ``failed`` with ``not_started`` / ``resources_gone`` / other."""

    id: RequestId
    context: AttemptContext


class Wait(_Message, frozen=True, kw_only=True, tag="wait"):
    """Wait for the segment behind ``handle`` to end; answered by ``finished`` or ``failed``."""

    id: RequestId
    handle: HandleId


class Stop(_Message, frozen=True, kw_only=True, tag="stop"):
    id: RequestId
    target: Target


class Interrupt(_Message, frozen=True, kw_only=True, tag="interrupt"):
    id: RequestId
    target: Target


class Inject(_Message, frozen=True, kw_only=True, tag="inject"):
    id: RequestId
    target: Target
    inputs: list[InputEvent]


class Output(_Message, frozen=True, kw_only=True, tag="output"):
    """Read only: the last ``max_bytes`` bytes the attempt wrote so far to ``stream``, running or
    ended (the console's live output polls it). Sent only to a program whose manifest declares
    the ``output`` capability; answered by ``output_text`` or ``failed``."""

    id: RequestId
    target: Target
    stream: Annotated[str, msgspec.Meta(pattern=r"^(stdout|stderr)$")]
    max_bytes: Annotated[int, msgspec.Meta(ge=1, le=MAX_OUTPUT_BYTES)]


class Cancel(_Message, frozen=True, kw_only=True, tag="cancel"):
    """The core no longer wants the reply to ``request`` (a cancelled wait); answered ``replied``.

    Cancelling a wait stops observing only: the work itself keeps running.
    """

    id: RequestId
    request: RequestId


class Shutdown(_Message, frozen=True, kw_only=True, tag="shutdown"):
    """Reply ``replied``, then exit. Started jobs keep running: a later program recovers them."""

    id: RequestId


# --- core -> executor: answers to callbacks -----------------------------------------------------


class CallbackOk(_Message, frozen=True, kw_only=True, tag="callback_ok"):
    id: RequestId


class LeaseLost(_Message, frozen=True, kw_only=True, tag="lease_lost"):
    """The attempt is no longer the program's: start nothing, stop what is started."""

    id: RequestId
    message: Text = ""


class CallbackRefused(_Message, frozen=True, kw_only=True, tag="callback_refused"):
    """The callback was invalid (too large, unknown request, …); ``error`` names the field."""

    id: RequestId
    error: WireError


# --- executor -> core: replies ------------------------------------------------------------------


class HandshakeOk(_Message, frozen=True, kw_only=True, tag="handshake_ok"):
    id: RequestId
    version: int
    manifest: WireManifest


class Launched(_Message, frozen=True, kw_only=True, tag="launched"):
    """Reply to ``run`` / ``resume`` / ``recover``: the segment's handle, for ``wait``.

    ``result``: the segment already ended while it was launched (a quick job, a finished one
    found by recovery); the core then sends no ``wait`` for it.
    """

    id: RequestId
    handle: HandleId
    result: Result | None = None


class Finished(_Message, frozen=True, kw_only=True, tag="finished"):
    """Reply to ``wait``: the segment's typed result."""

    id: RequestId
    result: Result


class Stopped(_Message, frozen=True, kw_only=True, tag="stopped"):
    """Reply to ``stop`` / ``interrupt``: ``verified`` only when nothing can still run."""

    id: RequestId
    verified: bool
    detail: Text = ""


class OutputText(_Message, frozen=True, kw_only=True, tag="output_text"):
    """Reply to ``output``: the tail as UTF-8 text (undecodable bytes replaced), at most the
    ``max_bytes`` asked for; ``null`` when the program keeps no such output for the attempt."""

    id: RequestId
    text: str | None = None


class Replied(_Message, frozen=True, kw_only=True, tag="replied"):
    """Reply to ``inject``, ``cancel`` and ``shutdown``."""

    id: RequestId


class RequestFailed(_Message, frozen=True, kw_only=True, tag="failed"):
    """Any request can fail with a coded error instead."""

    id: RequestId
    error: WireError


# --- executor -> core: fenced callbacks (each names the run/resume/recover it belongs to) -------


class RecordLaunchIntent(_Message, frozen=True, kw_only=True, tag="launch_intent"):
    id: RequestId
    request: RequestId
    intent: dict[str, Any]


class PersistRecovery(_Message, frozen=True, kw_only=True, tag="persist_recovery"):
    id: RequestId
    request: RequestId
    metadata: dict[str, Any]


class PhaseBegin(_Message, frozen=True, kw_only=True, tag="phase_begin"):
    id: RequestId
    request: RequestId
    name: Name


class PhaseEnd(_Message, frozen=True, kw_only=True, tag="phase_end"):
    id: RequestId
    request: RequestId
    name: Name
    outcome: PhaseOutcome


class Pin(_Message, frozen=True, kw_only=True, tag="pin"):
    id: RequestId
    request: RequestId
    ref: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]


CoreMessage = (
    Handshake | Run | Resume | Recover | Wait | Stop | Interrupt | Inject | Output | Cancel
    | Shutdown | CallbackOk | LeaseLost | CallbackRefused
)  # fmt: skip
ExecutorMessage = (
    HandshakeOk | Launched | Finished | Stopped | OutputText | Replied | RequestFailed
    | RecordLaunchIntent | PersistRecovery | PhaseBegin | PhaseEnd | Pin
)  # fmt: skip

#: Every message type, by the side that sends it (the bad-message tests walk these).
CORE_MESSAGES: tuple[type[msgspec.Struct], ...] = (
    Handshake, Run, Resume, Recover, Wait, Stop, Interrupt, Inject, Output, Cancel, Shutdown,
    CallbackOk, LeaseLost, CallbackRefused,
)  # fmt: skip
EXECUTOR_MESSAGES: tuple[type[msgspec.Struct], ...] = (
    HandshakeOk, Launched, Finished, Stopped, OutputText, Replied, RequestFailed,
    RecordLaunchIntent, PersistRecovery, PhaseBegin, PhaseEnd, Pin,
)  # fmt: skip


def wire_json_schema() -> dict[str, Any]:
    """The JSON Schema of both directions (kept in ``manifests/`` by a test)."""
    (core, executor), components = msgspec.json.schema_components(
        [CoreMessage, ExecutorMessage], ref_template="#/$defs/{name}"
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"conduit executor wire protocol, version {PROTOCOL_VERSION}",
        "description": (
            "Each frame: a 4-byte big-endian length, then that many bytes of UTF-8 JSON "
            f"(at most {MAX_FRAME_BYTES} bytes). See docs/wire-protocol.md."
        ),
        "$defs": {
            **components,
            "CoreMessage": core,
            "ExecutorMessage": executor,
        },
        "oneOf": [{"$ref": "#/$defs/CoreMessage"}, {"$ref": "#/$defs/ExecutorMessage"}],
    }
