"""Test-only fault injection at the shell executor's launch points; inert unless switched on.

``CONDUIT_TEST_FAULT=<point>:<action>[,<point>:<action>…]`` — points ``shell.before_intent``,
``shell.after_intent`` (intent recorded, nothing created yet) and ``shell.after_spawn`` (the job
runs, its recovery metadata is not recorded yet); actions ``kill`` (SIGKILL this very process, as
a crashing daemon) and ``sleep=<seconds>`` (widen the window for an outside kill). Crash tests
and the chaos drill use it; an operator never sets it.
"""

from __future__ import annotations

import os
import signal

import anyio

__all__ = ["FAULT_VARIABLE", "fault_point"]

FAULT_VARIABLE = "CONDUIT_TEST_FAULT"


async def fault_point(point: str) -> None:
    spec = os.environ.get(FAULT_VARIABLE)
    if not spec:
        return
    for item in spec.split(","):
        name, _, action = item.strip().partition(":")
        if name != point:
            continue
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action.startswith("sleep="):
            await anyio.sleep(float(action.removeprefix("sleep=")))
