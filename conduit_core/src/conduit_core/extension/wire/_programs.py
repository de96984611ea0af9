"""Programs an in-process executor starts and supervises itself (the python executor's warm mode).

An executor that wants some of its work done by a long-lived program on the wire protocol (a
worker keeping an interpreter warm) asks for one with :func:`supervised_program`. The daemon's own
supervisor runs it exactly like a ``[executors.NAME]`` program — started lazily, watched by pid,
restarted with backoff, its attempts handed to recovery when it dies — but with a working
directory and environment of the executor's choosing, and only for as long as the executor uses
it. The implementation lives in the daemon's layer, which registers it here when it loads
(:func:`set_program_factory`); the contract layer only names the shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from conduit_core.extension._executor import Executor
from conduit_core.extension._results import OperationError

__all__ = ["SupervisedProgram", "set_program_factory", "supervised_program"]


class SupervisedProgram(Protocol):
    """One supervised program: an executor per generation it serves, its pid, and a close."""

    def executor(self, generation: int) -> Executor:
        """The proxy that sends this generation's run / recover / stop to the program."""
        ...

    @property
    def pid(self) -> int | None:
        """The running program's pid, ``None`` while none runs."""
        ...

    async def close(self) -> None:
        """Ask the program to shut down (its answer, then its exit) and stop supervising it."""
        ...


ProgramFactory = Callable[..., SupervisedProgram]

_factory: list[ProgramFactory] = []


def set_program_factory(factory: ProgramFactory) -> None:
    """Called once by the daemon's layer (``conduit_core.remote``) when it is imported."""
    _factory[:] = [factory]


def supervised_program(
    name: str,
    command: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> SupervisedProgram:
    """A program speaking the wire protocol, run by the daemon's supervisor.

    ``name`` must equal the ``manifest.name`` of the program's handshake; ``env`` is added over
    the daemon's environment; ``cwd`` is its working directory. Nothing starts until the first
    request. Raises ``OperationError`` (``executor_unavailable``) outside a conduit process that
    loaded its plugins (nothing registered a supervisor)."""
    if not _factory:
        raise OperationError(
            "executor_unavailable",
            "no program supervisor is loaded in this process (import conduit_core.plugins)",
        )
    return _factory[0](name, tuple(command), cwd=cwd, env=dict(env or {}))
