"""``conduit daemon`` tunes its process's garbage collector before it runs (``daemon/_gc.py``).

Each case runs in a process of its own: the settings are process-wide.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conduit_core.daemon._gc import YOUNG_THRESHOLD

_REPORT = "import gc, json; print(json.dumps([gc.get_threshold(), gc.get_freeze_count()]))"


def _run(code: str) -> tuple[list[int], int]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    threshold, frozen = json.loads(out.strip().splitlines()[-1])
    return threshold, frozen


def test_tuning_freezes_the_heap_and_raises_the_young_threshold() -> None:
    before, frozen_before = _run(_REPORT)
    assert before[0] < YOUNG_THRESHOLD
    assert frozen_before == 0
    after, frozen = _run(
        "from conduit_core.daemon import tune_garbage_collection; tune_garbage_collection(); "
        + _REPORT
    )
    assert after == [YOUNG_THRESHOLD, before[1], before[2]]
    assert frozen > 1000  # the modules, classes and functions loaded so far


def test_the_daemon_command_runs_tuned() -> None:
    # The daemon's body is replaced by a report of the settings it would run with.
    threshold, frozen = _run(
        "import anyio, gc, json\n"
        "from conduit_core.cli import _daemon\n"
        "def report(fn, *args):\n"
        "    print(json.dumps([gc.get_threshold(), gc.get_freeze_count()]))\n"
        "anyio.run = report  # the command imports anyio when it runs\n"
        "_daemon.daemon_command.main(['--config', '/nonexistent.toml'], standalone_mode=False)\n"
    )
    assert threshold[0] == YOUNG_THRESHOLD
    assert frozen > 1000
