"""Entry point module of conduit-gate-human (group ``conduit``, name ``human``).

Registers the start gate ``human``: it holds the first start of Work its rules select (see
``_rules``) until a person approves (``conduit approve WORK``) or refuses (``conduit refuse WORK
--reason …``) it; the core records the settlement and, on refusal, cancels the Work.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Sequence

import anyio

from conduit_core.extension import GateRegistration, GateRequest, StartGate, StartHold, hookimpl
from conduit_gate_human._rules import CONFIG_ENV, GateConfig, load_config

__all__ = [
    "GATE_NAME",
    "HumanGate",
    "conduit_config_type",
    "conduit_configure",
    "conduit_start_gates",
]

GATE_NAME = "human"

log = logging.getLogger("conduit.gate.human")


#: The ``[plugins.human]`` table of the daemon's config, as last handed over (None: no table).
_configured: GateConfig | None = None


class HumanGate(StartGate):
    """Asks the ``[plugins.human]`` rules, else the ``CONDUIT_HUMAN_GATE_CONFIG`` file (read at
    every question, so an edited file applies to the next start)."""

    def may_hold(self, request: GateRequest) -> bool:
        """Only Work a rule selects is asked about; the fallback file is read only by asking."""
        if _configured is None:
            return bool(os.environ.get(CONFIG_ENV))
        return _configured.rule_for(request) is not None

    async def check(self, request: GateRequest) -> StartHold | None:
        # A broken fallback file raises: the core fails closed and asks again.
        config = _configured if _configured is not None else load_config()
        rule = config.rule_for(request)
        if rule is None:
            return None
        await notify(config, request, rule.reason)
        return StartHold(reason=rule.reason)


async def notify(config: GateConfig, request: GateRequest, reason: str) -> None:
    """Run the notify command, if any; its failure never changes the hold."""
    if not config.notify:
        return
    argv = shlex.split(config.notify) if isinstance(config.notify, str) else list(config.notify)
    env = {
        **os.environ,
        "CONDUIT_WORK_ID": request.work_id,
        "CONDUIT_BINDING": request.binding,
        "CONDUIT_SCOPE": request.scope,
        "CONDUIT_WORK_KIND": request.kind,
        "CONDUIT_HOLD_REASON": reason,
        "CONDUIT_APPROVE": f"conduit approve {request.work_id}",
    }
    try:
        with anyio.fail_after(config.notify_timeout_seconds):
            done = await anyio.run_process(argv, env=env, check=False)
        if done.returncode != 0:
            log.warning("notify command exited %d for work %s", done.returncode, request.work_id)
    except (OSError, TimeoutError) as exc:
        log.warning("notify command failed for work %s: %s", request.work_id, type(exc).__name__)


@hookimpl
def conduit_start_gates() -> Sequence[GateRegistration]:
    return [GateRegistration(name=GATE_NAME, gate=HumanGate())]


@hookimpl
def conduit_config_type() -> type[GateConfig]:
    return GateConfig


@hookimpl
def conduit_configure(config: GateConfig | None) -> None:
    global _configured
    _configured = config
