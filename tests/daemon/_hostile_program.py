"""A hostile executor program, written from docs/wire-protocol.md alone:
``python _hostile_program.py MODE ROOT``.

MODE ``hang_stop`` never answers ``stop``; ``fail_handshake`` passes the probe at load, then dies
before its handshake whenever it is started to serve; ``flood`` answers a ``run`` with 100,000
``phase_begin`` callbacks. ROOT is a folder of its own (it counts its starts there). Used by
tests/daemon/test_executor_isolation.py and bench/bench_hostile.py.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
from typing import Any

MODE, ROOT = sys.argv[1], sys.argv[2]
out = os.fdopen(os.dup(1), "wb", buffering=0)
inp = sys.stdin.buffer
write_lock = threading.Lock()


def send(message: dict[str, Any]) -> None:
    body = json.dumps(message).encode()
    with write_lock:
        out.write(struct.pack(">I", len(body)) + body)


def read() -> Any:
    header = inp.read(4)
    if len(header) < 4:
        return None
    (length,) = struct.unpack(">I", header)
    return json.loads(inp.read(length))


with open(os.path.join(ROOT, "hostile.starts"), "a") as starts:
    starts.write("start\n")
with open(os.path.join(ROOT, "hostile.starts")) as starts:
    started = len(starts.readlines())
if MODE == "fail_handshake" and started > 1:
    # It passed the probe at load; every later start (to serve) dies before its handshake.
    sys.stderr.write("hostile: refusing to serve\n")
    sys.exit(3)

FLOOD = 100_000
replies: dict[str, int] = {}
replied = threading.Event()


def flood(rid: int) -> None:
    send({"kind": "persist_recovery", "id": 1, "request": rid, "metadata": {"job": rid}})
    for i in range(2, FLOOD + 1):
        send({"kind": "phase_begin", "id": i, "request": rid, "name": f"step-{i % 7}"})
    replied.wait(240)
    summary = " ".join(f"{k}={v}" for k, v in sorted(replies.items()))
    result = {"outcome": "completed", "summary": summary[:1000]}
    send({"kind": "launched", "id": rid, "handle": "h", "result": result})


launching: dict[int, int] = {}
MANIFEST = {"name": "hostile", "generation": 1, "capabilities": ["stop"]}
while (msg := read()) is not None:
    kind, rid = msg["kind"], msg["id"]
    if kind == "handshake":
        send({"kind": "handshake_ok", "id": rid, "version": 1, "manifest": MANIFEST})
    elif kind == "run" and MODE == "flood":
        threading.Thread(target=flood, args=(rid,), daemon=True).start()
    elif kind == "run":
        # Recorded before it answers, as the protocol asks: the attempt then counts as running.
        launching[rid] = rid
        send({"kind": "persist_recovery", "id": rid, "request": rid, "metadata": {"job": rid}})
    elif kind == "callback_ok" and rid in launching:
        send({"kind": "launched", "id": launching.pop(rid), "handle": f"h-{rid}"})
    elif kind in ("callback_ok", "callback_refused", "lease_lost"):
        key = kind if kind != "callback_refused" else "refused:" + msg["error"]["code"]
        replies[key] = replies.get(key, 0) + 1
        if sum(replies.values()) >= FLOOD:
            replied.set()
    elif kind == "wait":
        pass  # the job runs until it is stopped
    elif kind == "recover":
        send({"kind": "failed", "id": rid, "error": {"code": "cannot_tell", "message": "?"}})
    elif kind == "stop" and MODE == "hang_stop":
        pass  # never answered
    elif kind == "stop":
        send({"kind": "stopped", "id": rid, "verified": True})
    elif kind in ("cancel", "shutdown"):
        send({"kind": "replied", "id": rid})
        if kind == "shutdown":
            break
