"""A real executor program that misbehaves on purpose: ``python _rogue_program.py MODE``.

It shakes hands correctly (unless MODE is about the handshake), then answers every ``run`` the
way MODE says. Used by test_bad_messages.py to show the daemon's side survives each.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time

MODE = sys.argv[1]
out = os.fdopen(os.dup(1), "wb", buffering=0)


def send_raw(body: bytes) -> None:
    out.write(struct.pack(">I", len(body)) + body)


def send(message: dict[str, object]) -> None:
    send_raw(json.dumps(message).encode())


def read() -> dict[str, object] | None:
    header = sys.stdin.buffer.read(4)
    if len(header) < 4:
        return None
    (length,) = struct.unpack(">I", header)
    return json.loads(sys.stdin.buffer.read(length))  # type: ignore[no-any-return]


MANIFEST = {"name": "rogue", "generation": 1, "capabilities": ["stop"]}
while (msg := read()) is not None:
    kind, rid = msg["kind"], msg["id"]
    if kind == "handshake":
        version = 2 if MODE == "version" else 1
        if MODE == "refuse_version":
            error = {"code": "unsupported_protocol", "message": "this program speaks 7..9"}
            send({"kind": "failed", "id": rid, "error": error})
        else:
            send({"kind": "handshake_ok", "id": rid, "version": version, "manifest": MANIFEST})
    elif kind == "run":
        if MODE == "unknown_kind":
            send({"kind": "teleported", "id": rid})
        elif MODE == "bad_field":
            send({"kind": "launched", "id": rid, "handle": 12})
        elif MODE in ("bad_result", "forgetful", "silent_wait"):
            send({"kind": "launched", "id": rid, "handle": "h"})
        elif MODE == "oversized":
            out.write(struct.pack(">I", 2**31))
        elif MODE == "not_json":
            send_raw(b"\x00\x01 not json")
        elif MODE == "hang":
            time.sleep(3600)
        elif MODE == "exit":
            sys.exit(3)
        elif MODE == "string_id":
            # A dynamic language's number turned string: the reply names its request as "7".
            send({"kind": "launched", "id": str(rid), "handle": "h"})
        elif MODE == "string_callback_id":
            send({"kind": "launch_intent", "id": "1", "request": rid, "intent": {}})
            answer = read()
            assert answer is not None
            code = answer["kind"] + ":" + answer.get("error", {}).get("message", "")  # type: ignore[attr-defined, operator]
            send({"kind": "failed", "id": rid, "error": {"code": "reported", "message": code}})
        elif MODE == "bad_callback":
            # intent must be an object; the core's answer is reported back as the error code.
            send({"kind": "launch_intent", "id": 1, "request": rid, "intent": "a string"})
            answer = read()
            assert answer is not None
            code = answer["kind"] + ":" + answer.get("error", {}).get("message", "")  # type: ignore[attr-defined, operator]
            send({"kind": "failed", "id": rid, "error": {"code": "reported", "message": code}})
    elif kind == "recover" and MODE == "forgetful":
        # It finds the segment again, finished: the result travels inline.
        result = {"outcome": "completed", "summary": "found again"}
        send({"kind": "launched", "id": rid, "handle": "h2", "result": result})
    elif kind == "recover":
        # Recovery after a restart: this program cannot tell, so the attempt would be held.
        error = {"code": "cannot_tell", "message": "the rogue program knows nothing"}
        send({"kind": "failed", "id": rid, "error": error})
    elif kind == "wait" and MODE == "silent_wait":
        pass  # never answered: the job runs on
    elif kind == "wait" and MODE == "forgetful":
        error = {"code": "unknown_handle", "message": "no such handle"}
        send({"kind": "failed", "id": rid, "error": error})
    elif kind == "wait":
        result = {"outcome": "completed", "usage": {"units": {"turns": 1}}}
        send({"kind": "finished", "id": rid, "result": result})
    elif kind == "stop":
        send({"kind": "stopped", "id": rid, "verified": True})
    elif kind == "shutdown":
        send({"kind": "replied", "id": rid})
        break
