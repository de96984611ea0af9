"""A real executor program, standard library only, for the daemon's program-supervision tests.

``python _probe_program.py`` speaks the wire protocol (docs/wire-protocol.md) as a program in
another language would, and behaves as each binding's ``config`` says:

- ``hold``: the job waits for ``<root>/release.<work id>`` before it ends;
- ``gate``: after its launch intent, the launch waits for ``<root>/gate.<work id>``, and the
  answer to its ``persist_recovery`` is appended to ``<root>/answers.log``;
- ``grandchild``: the launch also forks a ``setsid`` child that keeps the program's stdout open;
- ``crash_in_wait``: the first ``wait`` of an execution makes the program exit (status 7);
- ``crash_in_run``: the launch exits the program (status 7) once its recovery metadata is
  recorded, before it answers;
- ``launched``: ``"malformed"`` answers the run with a handle that is not a string;
- ``after_start``: ``"fail"`` answers the run ``failed`` after the job started (a job that
  runs until stopped), before persisting any recovery metadata;
- ``recover``: ``"cannot_tell"`` answers every ``recover`` so.

A job is a detached shell (its own session) that appends ``<work id> run`` to
``<root>/side-effects.log`` and leaves its pid and exit status in its launch folder,
``<state_dir>/<marker>``. The recovery metadata names the folder; the launch intent, recorded
before the folder exists, only the marker, so finding a launch by its intent (to recover or to
stop it) needs the host's ``state_dir`` too.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shlex
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

NAME = os.environ.get("PROBE_EXECUTOR_NAME", "probe")
MANIFEST = {"name": NAME, "generation": 1, "pool": "probe", "capabilities": ["stop"]}

out = os.fdopen(os.dup(1), "wb", buffering=0)
os.dup2(2, 1)
write_lock = threading.Lock()
answers: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
callback_ids = itertools.count(1)
handles: dict[str, Path] = {}


def send(message: dict[str, Any]) -> None:
    body = json.dumps(message).encode()
    with write_lock:
        out.write(struct.pack(">I", len(body)) + body)


def read() -> dict[str, Any] | None:
    header = sys.stdin.buffer.read(4)
    if len(header) < 4:
        return None
    (length,) = struct.unpack(">I", header)
    return json.loads(sys.stdin.buffer.read(length))  # type: ignore[no-any-return]


def callback(kind: str, request: int, **fields: Any) -> dict[str, Any]:
    cid = next(callback_ids)
    event, slot = threading.Event(), []
    answers[cid] = (event, slot)
    send({"kind": kind, "id": cid, "request": request, **fields})
    if not event.wait(60):
        os._exit(9)
    return slot[0]


def failed(rid: int, code: str, message: str = "") -> None:
    send({"kind": "failed", "id": rid, "error": {"code": code, "message": message}})


def launch_dir(recorded: dict[str, Any], state_dir: str | None) -> Path:
    if "dir" in recorded:  # recovery metadata
        return Path(recorded["dir"])
    return Path(state_dir or "/nonexistent-state-dir", recorded["marker"])


def status_of(folder: Path) -> int | None:
    try:
        return int((folder / "status").read_text())
    except (OSError, ValueError):
        return None


def job_alive(folder: Path) -> bool:
    try:
        os.killpg(int((folder / "pid").read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def result(code: int) -> dict[str, Any]:
    return {"outcome": "completed" if code == 0 else "failed", "summary": f"exit status {code}"}


def start_job(ctx: dict[str, Any], folder: Path) -> None:
    config, work = ctx["config"], ctx["work_id"]
    root = Path(config["root"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))  # what wait() goes by
    steps = [f"echo $$ > {folder}/pid", f"echo {shlex.quote(work)} run >> {root}/side-effects.log"]
    if config.get("hold"):
        steps.append(f"while test ! -e {root}/release.{work}; do sleep 0.05; done")
    if config.get("after_start") == "fail":
        steps.append("sleep 300")
    steps.append(f"echo 0 > {folder}/status.tmp && mv {folder}/status.tmp {folder}/status")
    job = subprocess.Popen(
        ["sh", "-c", "; ".join(steps)], start_new_session=True, cwd=root,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    threading.Thread(target=job.wait, daemon=True).start()  # reaps it while this program lives
    while not (folder / "pid").exists():
        time.sleep(0.01)


def run(rid: int, ctx: dict[str, Any]) -> None:
    config, work = ctx["config"], ctx["work_id"]
    root = Path(config["root"])
    marker = hashlib.sha256(ctx["execution_id"].encode()).hexdigest()[:16] + f"-{ctx['epoch']}"
    folder = launch_dir({"marker": marker}, ctx.get("state_dir"))
    if callback("launch_intent", rid, intent={"marker": marker})["kind"] != "callback_ok":
        return failed(rid, "intent_refused")
    if config.get("gate"):
        with (root / "side-effects.log").open("a") as side:
            side.write(f"{work} intent\n")
        while not (root / f"gate.{work}").exists():
            time.sleep(0.02)
    start_job(ctx, folder)
    if config.get("grandchild"):
        subprocess.Popen(
            ["sleep", "300"], start_new_session=True, cwd=root, stdin=subprocess.DEVNULL,
            stdout=out.fileno(),
        )  # fmt: skip
    if config.get("after_start") == "fail":  # before its recovery metadata: only the intent
        return failed(rid, "launch_broke", "it broke after starting the job")
    answer = callback("persist_recovery", rid, metadata={"marker": marker, "dir": str(folder)})
    if config.get("gate"):
        with (root / "answers.log").open("a") as log:
            log.write(f"{work} {answer['kind']}\n")
    if answer["kind"] != "callback_ok":
        return failed(rid, answer["kind"], "the core refused the recovery metadata")
    if config.get("crash_in_run"):
        os._exit(7)
    if config.get("launched") == "malformed":
        return send({"kind": "launched", "id": rid, "handle": 12})
    handles[marker] = folder
    send({"kind": "launched", "id": rid, "handle": marker})


def recover(rid: int, ctx: dict[str, Any]) -> None:
    if ctx["config"].get("recover") == "cannot_tell":
        return failed(rid, "cannot_tell", "the probe program cannot tell")
    launch = ctx.get("recovery") or ctx.get("launch_intent")
    if launch is None:
        return failed(rid, "not_started", "nothing was recorded")
    folder = launch_dir(launch, ctx.get("state_dir"))
    code = status_of(folder)
    if code is not None:
        send({"kind": "launched", "id": rid, "handle": launch["marker"], "result": result(code)})
    elif job_alive(folder):
        handles[launch["marker"]] = folder
        send({"kind": "launched", "id": rid, "handle": launch["marker"]})
    elif ctx.get("recovery") is None:
        failed(rid, "not_started", "no job in its launch folder")
    else:
        failed(rid, "resources_gone", "the job left no exit status")


def wait(rid: int, handle: str) -> None:
    folder = handles.get(handle)
    if folder is None:
        return failed(rid, "unknown_handle")
    crash_mark = folder / "crashed"
    config = json.loads((folder / "config.json").read_text())
    if config.get("crash_in_wait") and not crash_mark.exists():
        crash_mark.touch()
        os._exit(7)
    while (code := status_of(folder)) is None:
        time.sleep(0.02)
    send({"kind": "finished", "id": rid, "result": result(code)})


def stop(rid: int, target: dict[str, Any]) -> None:
    launch = target.get("recovery") or target.get("launch_intent")
    if launch is None or ("dir" not in launch and target.get("state_dir") is None):
        detail = f"cannot find the launch: the target has {sorted(target)}"
        return send({"kind": "stopped", "id": rid, "verified": False, "detail": detail})
    folder = launch_dir(launch, target.get("state_dir"))
    if job_alive(folder):
        os.killpg(int((folder / "pid").read_text()), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while job_alive(folder) and time.monotonic() < deadline:
            time.sleep(0.02)
    verified = not job_alive(folder)
    send({"kind": "stopped", "id": rid, "verified": verified, "detail": f"launch {folder.name}"})


def serve(message: dict[str, Any]) -> None:
    kind, rid = message["kind"], message["id"]
    if kind in ("run", "recover"):
        (run if kind == "run" else recover)(rid, message["context"])
    elif kind == "wait":
        wait(rid, message["handle"])
    elif kind == "stop":
        stop(rid, message["target"])
    elif kind in ("cancel", "shutdown"):
        send({"kind": "replied", "id": rid})
        if kind == "shutdown":
            os._exit(0)
    else:
        failed(rid, "unsupported", kind)


while (msg := read()) is not None:
    if msg["kind"] == "handshake":
        send({"kind": "handshake_ok", "id": msg["id"], "version": 1, "manifest": MANIFEST})
    elif msg["kind"] in ("callback_ok", "lease_lost", "callback_refused"):
        event, slot = answers.pop(msg["id"])
        slot.append(msg)
        event.set()
    else:
        threading.Thread(target=serve, args=(msg,), daemon=True).start()
