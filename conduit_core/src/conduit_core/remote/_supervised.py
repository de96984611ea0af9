"""The daemon's side of :func:`conduit_core.extension.wire.supervised_program`.

A program an in-process executor starts for itself (the python executor's warm workers) is run by
the same :class:`ProgramSupervisor` and :class:`RemoteExecutor` as a ``[executors.NAME]`` program:
the same restarts, the same ``LostSightError`` into recovery when it dies under an attempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from conduit_core.extension import Executor
from conduit_core.remote._proxy import ProgramSettings, ProgramSupervisor, RemoteExecutor

__all__ = ["SupervisedWorker"]


class SupervisedWorker:
    """One supervised program and its proxies (one per generation asked for)."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.supervisor = ProgramSupervisor(
            name, command, expected=None, settings=ProgramSettings(), env=env, cwd=cwd
        )
        self._executors: dict[int, RemoteExecutor] = {}

    def executor(self, generation: int) -> Executor:
        if generation not in self._executors:
            self._executors[generation] = RemoteExecutor(self.supervisor, generation, None)
        return self._executors[generation]

    @property
    def pid(self) -> int | None:
        pid = self.supervisor.state()["pid"]
        return pid if isinstance(pid, int) else None

    async def close(self) -> None:
        await self.supervisor.close()
