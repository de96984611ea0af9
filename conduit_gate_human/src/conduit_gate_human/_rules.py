"""The human gate's own config: which Work needs a person, and who to notify.

It lives in ``conduit.toml`` as the table ``[plugins.human]`` (validated by ``conduit config
check``, handed over at daemon start and on every reload)::

    [plugins.human]
    notify = ["notify-send", "conduit: approval needed"]   # optional argv (or one shell string)

    [[plugins.human.rules]]
    bindings = ["deploy"]     # any of these bindings (omitted: any binding)
    scopes = ["prod"]         # any of these scopes (omitted: any scope)
    kinds = ["task"]          # any of these Work kinds (omitted: any kind)
    reason = "production deploys need a person"

A Work needs approval when any rule matches it (every key a rule gives must match).

Fallback (the way before ``[plugins.*]``): without a ``[plugins.human]`` table the gate reads the
same keys, top level, from a TOML file named by ``CONDUIT_HUMAN_GATE_CONFIG``, at every question.
With neither, nothing needs approval.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated

import msgspec

from conduit_core.errors import ConfigError
from conduit_core.extension import MAX_SECONDS, GateRequest

__all__ = ["CONFIG_ENV", "GateConfig", "Rule", "load_config"]

CONFIG_ENV = "CONDUIT_HUMAN_GATE_CONFIG"


class Rule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    bindings: list[str] | None = None
    scopes: list[str] | None = None
    kinds: list[str] | None = None
    reason: Annotated[str, msgspec.Meta(max_length=1000)] = (
        "a person must approve this Work before it starts"
    )

    def matches(self, request: GateRequest) -> bool:
        return (
            (self.bindings is None or request.binding in self.bindings)
            and (self.scopes is None or request.scope in self.scopes)
            and (self.kinds is None or request.kind in self.kinds)
        )


class GateConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    rules: list[Rule] = []
    #: Run when a hold is placed, with CONDUIT_WORK_ID, CONDUIT_BINDING, CONDUIT_SCOPE,
    #: CONDUIT_WORK_KIND and CONDUIT_HOLD_REASON in its environment.
    notify: list[str] | str | None = None
    notify_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)] = 30.0

    def rule_for(self, request: GateRequest) -> Rule | None:
        return next((rule for rule in self.rules if rule.matches(request)), None)


def load_config(environ: dict[str, str] | None = None) -> GateConfig:
    """The config the variable names (an empty one without it); ``ConfigError`` when unusable."""
    env = os.environ if environ is None else environ
    path = env.get(CONFIG_ENV)
    if not path:
        return GateConfig()
    try:
        raw = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path} ({CONFIG_ENV}): cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} ({CONFIG_ENV}): invalid TOML: {exc}") from exc
    try:
        return msgspec.convert(raw, GateConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path} ({CONFIG_ENV}): {exc}") from exc
