"""The pluggy markers of project ``conduit`` and the hook specifications.

A plugin package declares an entry point in group ``conduit`` pointing at a module (or object)
with ``@hookimpl`` functions. Hooks are synchronous and return registrations or plain values;
the objects they return have async methods. Implementations may take only the arguments they
need, so new arguments can be added later without breaking anyone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import pluggy

from conduit_core.extension._executor import Executor
from conduit_core.extension._gates import StartGate
from conduit_core.extension._results import Result, RetryHint
from conduit_core.extension._schedules import ScheduleSource

__all__ = [
    "ExecutorRegistration",
    "GateRegistration",
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
]

#: The pluggy project name and the entry point group.
PROJECT_NAME = "conduit"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@dataclass(frozen=True, kw_only=True)
class ExecutorRegistration:
    """One executor generation's implementation. Register one per generation you support."""

    name: str
    generation: int
    executor: Executor
    #: Optional: decodes a binding's ``config`` table the way ``run`` will, raising
    #: ``OperationError("invalid_config", …)`` naming the ``$.path`` of a bad field. Given, it
    #: lets ``conduit config check``, daemon start and reload refuse a bad binding config before
    #: any attempt runs. ``None``: the config is first read when an attempt starts.
    check_config: Callable[[Mapping[str, Any]], object] | None = None
    #: Optional: a deeper check of a binding's ``config`` that may start processes or take
    #: seconds (the python executor imports the function in the binding's interpreter). Run by
    #: ``conduit config check`` only, after ``check_config`` passed — never at daemon start or
    #: reload, which must not run user code. Raise ``OperationError`` with a stable code of your
    #: own; conduit reports it with that code, naming the file and the binding.
    check_binding: Callable[[Mapping[str, Any]], object] | None = None


@dataclass(frozen=True, kw_only=True)
class GateRegistration:
    """A start gate under a registration name (unique across every installed package)."""

    name: str
    gate: StartGate


class HookSpecs:
    """The hook specifications of project ``conduit``."""

    @hookspec
    def conduit_executors(self) -> Sequence[ExecutorRegistration]:
        """Return the executor implementations this plugin provides, one per generation.

        Called once when plugins load. Each (name, generation) must be declared by the plugin's
        manifest (as ``generation`` or in ``historical_generations``) and registered by exactly one
        plugin. Return an empty sequence when the plugin has no executors.
        """
        raise NotImplementedError

    @hookspec
    def conduit_start_gates(self) -> Sequence[GateRegistration]:
        """Return the start gates this plugin provides.

        Called once when plugins load. Gate names are unique across plugins and must be declared
        in the plugin's manifest ``gates``. Return an empty sequence when there are none.
        """
        raise NotImplementedError

    @hookspec
    def conduit_config_type(self) -> type[msgspec.Struct] | None:
        """Return the msgspec Struct type of this plugin's ``[plugins.NAME]`` table in
        ``conduit.toml`` (NAME: the plugin's entry point name), or ``None`` for no config.

        Called once when plugins load. conduit decodes the table with it (declare the Struct
        ``forbid_unknown_fields=True`` and bound its numbers) in ``conduit config check``, at
        daemon start and before a reload, and refuses a bad table with the key path of the bad
        field (``$.plugins.NAME.rules[0].scopes``). A table for a plugin that returns ``None`` is
        refused too.
        """
        raise NotImplementedError

    @hookspec
    def conduit_configure(self, config: Any) -> None:
        """Take this plugin's decoded ``[plugins.NAME]`` config (``None``: the file has none).

        Called by a daemon after its config is validated, at start and after every reload that
        went through (a refused reload keeps the config the plugin has). Not called by
        ``conduit config check``. Raising refuses the daemon start; on a reload the error is
        logged and the plugin keeps its previous config.
        """
        raise NotImplementedError

    @hookspec
    def conduit_run_environment(self, scope_chain: Sequence[str]) -> Mapping[str, str] | None:
        """Return environment variables for an attempt in this scope chain (root first).

        Called before every run and resume (never for a recovery). Return ``None`` to add
        nothing. The values are never persisted or logged. Raising fails the attempt as
        ``environment_unavailable`` before its executor is called. Two plugins giving different
        values for one name is also ``environment_unavailable``.
        """
        raise NotImplementedError

    @hookspec
    def conduit_retry_hint(
        self, executor: str, error: BaseException | None, result: Result | None
    ) -> RetryHint | None:
        """Classify a failed attempt: return a :class:`RetryHint` or ``None`` to say nothing.

        Called after an attempt fails, outside any transaction, with the executor's name and
        either the exception its handle raised or its failed result. When several plugins answer,
        the latest reset wins (the most conservative delay).
        """
        raise NotImplementedError

    @hookspec
    def conduit_schedule_sources(self) -> Sequence[ScheduleSource]:
        """Return schedule sources this plugin adds to the unified schedule view.

        Called once when a daemon starts. Each source's ``name`` must be unique across plugins
        and the core's own (``conduit``, ``crontab``) and contain no ``:``; its ``read()`` must
        never raise (a backend that is down answers ``degraded``). conduit lists these schedules
        beside its Routines and never fires them. Return an empty sequence when there are none.
        """
        raise NotImplementedError
