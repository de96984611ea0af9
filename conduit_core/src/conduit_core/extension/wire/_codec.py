"""Framing and decoding of wire messages, shared by the daemon's proxy and the program SDK.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON. Every way a frame can
be wrong is a :class:`WireProtocolError` with a stable code and a message naming the field, so a
misbehaving peer is reported, never a crash of the side that reads it.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.extension.wire._messages import (
    MAX_FRAME_BYTES,
    CoreMessage,
    ExecutorMessage,
)
from conduit_core.validation import InvalidValueError, decode_bounded

__all__ = [
    "HEADER",
    "WireProtocolError",
    "decode_core_message",
    "decode_executor_message",
    "encode_frame",
    "frame_length",
]

HEADER = struct.Struct(">I")

_core_decoder = msgspec.json.Decoder(CoreMessage)
_executor_decoder = msgspec.json.Decoder(ExecutorMessage)
_encoder = msgspec.json.Encoder()
_MAX_ID = 2**53 - 1


class _Envelope(msgspec.Struct):
    # Only to name the request a bad message answers, so its caller gets the error.
    id: Any = None
    kind: Any = None


class WireProtocolError(ConduitError):
    """A frame or message the peer should not have sent.

    Codes: ``wire_oversized`` (length over the limit), ``wire_malformed`` (not a JSON object),
    ``wire_unknown_message`` (``$.kind`` missing or unknown), ``wire_invalid_message`` (a field
    of a known message is wrong; the message names its ``$.path``). ``request_id`` is the id the
    bad message carried, when it had a readable one.
    """

    code = "wire_invalid_message"

    def __init__(
        self, code: str, message: str, *, request_id: int | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.request_id = request_id
        self.kind = kind


def encode_frame(message: msgspec.Struct) -> bytes:
    body = _encoder.encode(message)
    if len(body) > MAX_FRAME_BYTES:
        raise WireProtocolError(
            "wire_oversized",
            f"{type(message).__name__} message is {len(body)} bytes; frames are limited to "
            f"{MAX_FRAME_BYTES} bytes",
        )
    return HEADER.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """The body length a frame header announces; ``wire_oversized`` over the limit."""
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise WireProtocolError(
            "wire_oversized", f"frame announces {length} bytes; the limit is {MAX_FRAME_BYTES}"
        )
    return int(length)


def decode_core_message(body: bytes) -> CoreMessage:
    """A message the core sent (read by an executor program)."""
    return _decode(_core_decoder.decode, body, digit_ids=False)  # type: ignore[no-any-return]


def decode_executor_message(body: bytes) -> ExecutorMessage:
    """A message an executor program sent (read by the core)."""
    return _decode(_executor_decoder.decode, body, digit_ids=True)  # type: ignore[no-any-return]


def _decode(decode: Any, body: bytes, *, digit_ids: bool) -> Any:
    try:
        return decode_bounded(
            decode, body, field="message", max_bytes=MAX_FRAME_BYTES, json_text=True
        )
    except InvalidValueError as exc:
        raise WireProtocolError("wire_malformed", exc.message) from exc
    except msgspec.ValidationError as exc:
        request_id, kind = _envelope(body, digit_ids=digit_ids)
        detail = str(exc)
        if " - at " not in detail and detail.startswith("Expected `object`"):
            raise WireProtocolError("wire_malformed", f"not a message object: {detail}") from exc
        if "`$.kind`" in detail or "missing required field `kind`" in detail:
            raise WireProtocolError(
                "wire_unknown_message",
                f"unknown message: {detail}",
                request_id=request_id,
                kind=kind,
            ) from exc
        raise WireProtocolError(
            "wire_invalid_message", f"invalid message: {detail}", request_id=request_id, kind=kind
        ) from exc
    except msgspec.DecodeError as exc:
        raise WireProtocolError("wire_malformed", f"not a JSON message: {exc}") from exc


def _envelope(body: bytes, *, digit_ids: bool) -> tuple[int | None, str | None]:
    try:
        envelope = msgspec.json.decode(body, type=_Envelope)
    except (msgspec.DecodeError, RecursionError):
        return None, None
    rid, kind = envelope.id, envelope.kind
    if digit_ids and isinstance(rid, str) and rid.isascii() and rid.isdigit() and len(rid) <= 16:
        # An id a program in a dynamic language turned into a string ("7"): the message is still
        # refused (its error names `$.id`), but the error reaches the request or callback it
        # answers instead of leaving it to time out. (The core never sends one.)
        rid = int(rid)
    good_id = isinstance(rid, int) and not isinstance(rid, bool) and 1 <= rid <= _MAX_ID
    return (rid if good_id else None), (kind if isinstance(kind, str) else None)
