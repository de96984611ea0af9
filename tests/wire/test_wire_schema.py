"""The wire protocol's messages: the JSON Schema in manifests/ is in sync, every type round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from conduit_core.extension import wire
from conduit_core.extension.wire.schema import render

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "manifests" / "wire-protocol.schema.json"
DOC = Path(__file__).resolve().parents[2] / "docs" / "wire-protocol.md"


def test_json_schema_in_manifests_folder_is_in_sync() -> None:
    assert SCHEMA_FILE.read_text() == render(), (
        "manifests/wire-protocol.schema.json is stale; regenerate it with "
        "`python -m conduit_core.extension.wire.schema > manifests/wire-protocol.schema.json`"
    )


def _kinds(types: tuple[type[msgspec.Struct], ...]) -> set[str]:
    return {str(t.__struct_config__.tag) for t in types}


def test_every_message_type_is_in_a_union_and_in_the_doc() -> None:
    core, executor = _kinds(wire.CORE_MESSAGES), _kinds(wire.EXECUTOR_MESSAGES)
    assert not core & executor, "a kind may travel one way only"
    schema = json.loads(render())
    for union, types in (
        ("CoreMessage", wire.CORE_MESSAGES),
        ("ExecutorMessage", wire.EXECUTOR_MESSAGES),
    ):
        refs = {r["$ref"].rsplit("/", 1)[1] for r in schema["$defs"][union]["anyOf"]}
        assert refs == {t.__name__ for t in types}
    doc = DOC.read_text()
    for kind in core | executor:
        assert f"`{kind}`" in doc, f"docs/wire-protocol.md does not document message {kind!r}"


def test_a_message_round_trips_through_a_frame() -> None:
    msg = wire.Stopped(id=7, verified=True, detail="gone")
    frame = wire.encode_frame(msg)
    length = wire.frame_length(frame[: wire.HEADER.size])
    assert length == len(frame) - wire.HEADER.size
    assert wire.decode_executor_message(frame[wire.HEADER.size :]) == msg
    body = msgspec.json.encode(wire.Shutdown(id=3))
    assert json.loads(body) == {"kind": "shutdown", "id": 3}
    assert wire.decode_core_message(body) == wire.Shutdown(id=3)


def test_the_attempt_context_never_shows_its_env() -> None:
    ctx = wire.AttemptContext(
        execution_id="x", work_id="w", attempt=1, epoch=1, scope="root", binding="b",
        executor="e", generation=1, env={"TOKEN": "s3cret"},
    )  # fmt: skip
    run = wire.Run(id=1, context=ctx)
    assert "s3cret" not in repr(ctx)
    assert "s3cret" not in repr(run)
    assert "s3cret" not in str(run)


@pytest.mark.parametrize("size", [wire.MAX_FRAME_BYTES + 1, 2**32 - 1])
def test_an_oversized_frame_is_refused_by_its_header(size: int) -> None:
    with pytest.raises(wire.WireProtocolError) as caught:
        wire.frame_length(wire.HEADER.pack(size))
    assert caught.value.code == "wire_oversized"
    assert str(wire.MAX_FRAME_BYTES) in caught.value.message
