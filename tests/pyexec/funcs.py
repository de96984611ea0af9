"""Functions the python executor's tests run; imported by the job's own interpreter (the tests put
the repository on its ``PYTHONPATH`` through the binding's ``env``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from pathlib import Path

import msgspec

from conduit_executors_python import Permanent, Retry


class Size(msgspec.Struct):
    width: int
    height: int


class Area(msgspec.Struct):
    size: Size
    area: int
    label: str


def area(size: Size, label: str = "box") -> Area:
    return Area(size=size, area=size.width * size.height, label=label)


async def doubled(n: int) -> list[int]:
    await asyncio.sleep(0)
    return [n, n * 2]


def nothing() -> None:
    print("ran")


def fails(message: str) -> int:
    raise ValueError(message)


def gives_up() -> int:
    raise Permanent("the order is gone")


def later(after: float) -> int:
    raise Retry("busy", after=after)


def environment(name: str) -> str | None:
    return os.environ.get(name)


def wrong_return() -> int:
    return "not an int"  # type: ignore[return-value]


def run_script() -> None:
    """The conformance suite's job: its POSIX sh script (binding env ``PYEXEC_SCRIPT``)."""
    status = subprocess.run(["/bin/sh", "-c", os.environ["PYEXEC_SCRIPT"]], check=False).returncode
    if status != 0:
        raise RuntimeError(f"the script exited with status {status}")


def once(side: str, release: str) -> str:
    """Record a start, wait for the test to release it (deadline 120 s), record the end."""
    with open(side, "a") as out:
        out.write(f"{os.environ['CONDUIT_WORK_ID']} start\n")
    deadline = time.monotonic() + 120
    while not Path(release).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} never appeared")
        time.sleep(0.05)
    with open(side, "a") as out:
        out.write(f"{os.environ['CONDUIT_WORK_ID']} end\n")
    return "done"


def pid() -> int:
    """Warm mode: the worker's pid (the same for every attempt a worker runs)."""
    return os.getpid()


def warm_once(side: str, release: str, tag: str) -> int:
    """Warm mode: record ``tag start <pid>``, wait for the test to release it (deadline 120 s),
    record ``tag end``. Warm functions share a process: no per-attempt ``CONDUIT_*`` here."""
    with open(side, "a") as out:
        out.write(f"{tag} start {os.getpid()}\n")
    deadline = time.monotonic() + 120
    while not Path(release).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} never appeared")
        time.sleep(0.02)
    with open(side, "a") as out:
        out.write(f"{tag} end\n")
    return os.getpid()


def blocks(side: str, seconds: float) -> None:
    """Record a start, then block in one C call (no Python code runs until it returns)."""
    with open(side, "a") as out:
        out.write(f"start {os.getpid()}\n")
    time.sleep(seconds)
    with open(side, "a") as out:
        out.write("end\n")


async def naps(side: str, seconds: float) -> None:
    """Record a start, then await a long sleep (cancellable), then record the end."""
    Path(side).write_text(f"start {os.getpid()}\n")  # noqa: ASYNC240 (a test's tiny file)
    await asyncio.sleep(seconds)
    Path(side).write_text(f"start {os.getpid()}\nend\n")  # noqa: ASYNC240


def positional(n: int, /) -> int:
    """Config check: a positional-only parameter cannot be given by name."""
    return n


def undecodable(lock: threading.Lock) -> None:
    """Config check: msgspec cannot decode a lock from JSON."""
