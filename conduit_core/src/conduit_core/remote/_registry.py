"""Out-of-process executors as registrations: probed at load, one proxy per generation.

Both ways of declaring one end here: a package's manifest entry with ``command`` (checked
against the program's handshake), and a ``[executors.NAME]`` table in conduit.toml (the manifest
comes from the handshake alone). Loading starts the program once, shakes hands and shuts it
down, so a protocol version mismatch or a broken program refuses the plugin at load, naming the
versions. The probe's answer is cached per process for the same command and program files.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from conduit_core.errors import ManifestError, PluginLoadError
from conduit_core.extension import ExecutorManifest, ExecutorRegistration
from conduit_core.extension.wire import WireManifest
from conduit_core.remote._datacheck import check_config
from conduit_core.remote._program import ProgramGone, probe_program
from conduit_core.remote._proxy import ProgramSettings, ProgramSupervisor, RemoteExecutor

__all__ = ["ProgramSpec", "RemoteExecutors", "load_remote", "resolve_command"]

_probed: dict[tuple[object, ...], WireManifest] = {}


@dataclass(frozen=True, kw_only=True)
class ProgramSpec:
    """How to run one out-of-process executor (from a manifest or conduit.toml)."""

    command: tuple[str, ...]
    settings: ProgramSettings = field(default_factory=ProgramSettings)
    #: The config file that declares it (``[executors.NAME]``), for messages; ``None`` for a
    #: package's manifest.
    source: str | None = None
    #: ``command`` as the file wrote it, before a relative path was resolved.
    written: tuple[str, ...] = ()


@dataclass(frozen=True)
class RemoteExecutors:
    """What loading one program gives the plugin registry."""

    manifest: ExecutorManifest
    registrations: list[ExecutorRegistration]
    supervisor: ProgramSupervisor


def resolve_command(command: Sequence[str]) -> tuple[str, ...]:
    """A bare program name is looked up beside this Python first (a package's console script in
    the daemon's own virtualenv), then on ``PATH``; a path is kept as it is."""
    if not command:
        raise ManifestError("command: must name a program")
    first = command[0]
    if os.sep not in first:
        beside = Path(sys.executable).parent / first
        found = str(beside) if beside.is_file() else shutil.which(first)
        if found is not None:
            first = found
    return (first, *command[1:])


def _check_program_exists(spec: ProgramSpec, command: tuple[str, ...], where: str) -> None:
    """Name the program that is not there, as it was written and as it was resolved."""
    first = command[0]
    if os.sep not in first:
        raise PluginLoadError(
            f"{where}: program {first!r} is neither beside conduit's Python "
            f"({Path(sys.executable).parent}) nor on PATH",
            code="executor_command_not_found",
        )
    if os.path.exists(first):
        return
    written = spec.written[0] if spec.written else first
    how = ""
    if written != first:
        how = f" ({written!r} is relative to the config file's folder)"
    raise PluginLoadError(
        f"{where}: {first!r} does not exist{how}",
        code="executor_command_not_found",
    )


def _cache_key(name: str, command: tuple[str, ...]) -> tuple[object, ...]:
    stamps: list[int | None] = []
    for part in command:
        try:
            stamps.append(os.stat(part).st_mtime_ns)
        except OSError:
            stamps.append(None)
    return (name, command, tuple(stamps))


def load_remote(
    name: str, spec: ProgramSpec, *, where: str, declared: ExecutorManifest | None
) -> RemoteExecutors:
    """Probe the program and build its registrations; errors name ``where`` and the field."""
    command = resolve_command(spec.command)
    if spec.source is not None:
        _check_program_exists(spec, command, f"{where} command[0]")
    key = _cache_key(name, command)
    got = _probed.get(key)
    if got is None:
        try:
            got = probe_program(name, command, timeout=spec.settings.handshake_timeout)
        except ProgramGone as exc:
            raise PluginLoadError(f"{where}: {exc.message}", code=exc.code) from exc
        _probed[key] = got
    if got.name != name:
        raise ManifestError(
            f"{where}: the program's handshake names executor {got.name!r} in "
            f"$.manifest.name; it must equal the name it is declared under, {name!r}",
            code="executor_name_mismatch",
        )
    if declared is not None:
        for attr in ("generation", "pool", "historical_generations", "capabilities"):
            want, have = getattr(declared, attr), getattr(got, attr)
            if want != have:
                raise ManifestError(
                    f"{where}: executors.{name}.{attr} is {want!r} in the manifest but the "
                    f"program's handshake says {have!r}"
                )
    manifest = declared or ExecutorManifest(
        name=got.name, generation=got.generation, pool=got.pool,
        historical_generations=list(got.historical_generations),
        capabilities=list(got.capabilities), description=got.description, command=list(command),
    )  # fmt: skip
    supervisor = ProgramSupervisor(name, command, expected=manifest, settings=spec.settings)
    check = None if got.config_schema is None else partial(check_config, got.config_schema)
    registrations = [
        ExecutorRegistration(
            name=name,
            generation=generation,
            executor=RemoteExecutor(supervisor, generation, got.result_data_schema),
            check_config=check,
        )
        for generation in manifest.generations()
    ]
    return RemoteExecutors(manifest, registrations, supervisor)
