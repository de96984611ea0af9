"""The test-only switches conduit's suite uses; a production install never has this module.

Registered under the entry point group ``conduit.test_switches`` (see
``conduit_core/extension/_switches.py``). Each variable is read once, when a process looks the
provider up; spawned racers and daemon subprocesses inherit the variables and read them again.

- ``CONDUIT_TEST_UNSAFE=<protection>[,…]`` switches protections off, for a race detector's
  negative control (``conduit_core.extension.PROTECTIONS`` lists them).
- ``CONDUIT_TEST_FAULT=<point>:<action>[,…]`` acts at a launch's fault points (the shell
  executor's ``shell.before_intent``, ``shell.after_intent``, ``shell.after_spawn``; the container
  handle's ``container.after_record``, ``container.after_remove``) and the store's
  ``store.capacity_counted`` (a claim counted the slot holders, not yet committed) and
  ``store.submit_key_read`` (a keyed submit decided on its key's row, not yet committed),
  ``store.submit_key_met`` (its insert met an existing row, not locked yet) and
  ``store.submit_key_taken_over`` (it pointed a stale row at its new Work, not yet committed): ``kill``
  SIGKILLs this very process, as a crashing daemon; ``sleep=<seconds>`` widens the window for an
  outside kill or a race.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping

import anyio

from conduit_core.extension import SWITCH_VARIABLES, ConduitError

__all__ = ["PROVIDER", "EnvironmentSwitches"]


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


class EnvironmentSwitches:
    """Switches read from this process's environment."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ

    def _env(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    def active(self) -> Mapping[str, str]:
        env = self._env()
        return {name: env[name] for name in SWITCH_VARIABLES if env.get(name)}

    def protections_off(self) -> frozenset[str]:
        return frozenset(_items(self._env().get("CONDUIT_TEST_UNSAFE", "")))

    def _actions(self, point: str) -> list[str]:
        actions = []
        for item in _items(self._env().get("CONDUIT_TEST_FAULT", "")):
            name, _, action = item.partition(":")
            if name != point:
                continue
            if action != "kill" and not action.startswith("sleep="):
                raise ConduitError(
                    f"CONDUIT_TEST_FAULT: unknown action {action!r} at {point!r} "
                    "(kill, sleep=<seconds>)",
                    code="test_switch_unknown",
                )
            actions.append(action)
        return actions

    async def fault_point(self, point: str) -> None:
        for action in self._actions(point):
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                await anyio.sleep(float(action.removeprefix("sleep=")))

    def fault_point_sync(self, point: str) -> None:
        for action in self._actions(point):
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                time.sleep(float(action.removeprefix("sleep=")))

PROVIDER = EnvironmentSwitches()
