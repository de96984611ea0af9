"""The binding config of the container executor, as an operator writes it in ``conduit.toml``."""

from __future__ import annotations

import math
import posixpath
import signal
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from conduit_core.extension import MAX_SECONDS, OperationError

__all__ = [
    "DEFAULT_LOG_LIMIT_BYTES",
    "RESULT_MOUNT",
    "ContainerConfig",
    "MountConfig",
    "decode_config",
]

#: How much of the container's stdout and of its stderr is kept by default (the tail is kept).
DEFAULT_LOG_LIMIT_BYTES = 1024 * 1024
#: Where the executor's result directory appears inside the container.
RESULT_MOUNT = "/conduit"

AbsolutePath = Annotated[str, msgspec.Meta(pattern=r"^/")]
Image = Annotated[str, msgspec.Meta(min_length=1)]
Argv = Annotated[list[str], msgspec.Meta(min_length=1)]
ShellLine = Annotated[str, msgspec.Meta(min_length=1)]
# A network name: "none", "bridge", "host" or a user-defined network. "container:<id>" is left
# out on purpose: joining another container's namespace would escape the executor's isolation.
NetworkName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
# Bytes, optionally with a b/k/m/g suffix, as `docker run --memory` takes them.
MemorySize = Annotated[str, msgspec.Meta(pattern=r"^[0-9]+[bBkKmMgG]?$")]
# Bounded above: an infinite grace or timeout once overflowed the engine call (math.ceil(inf)).
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)]
NonNegativeSeconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
PositiveCpus = Annotated[float, msgspec.Meta(gt=0, le=4096)]
ByteLimit = Annotated[int, msgspec.Meta(ge=0)]


class MountConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A bind mount of an explicit absolute host path (named volumes are not offered)."""

    source: AbsolutePath
    target: AbsolutePath
    read_only: bool = False


class ContainerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One container binding. A string ``command`` runs through ``/bin/sh -c``; a list is argv;
    none runs the image's own command."""

    image: Image
    command: Argv | ShellLine | None = None
    env: dict[str, str] = {}
    workdir: AbsolutePath | None = None
    mounts: list[MountConfig] = []
    network: NetworkName = "none"
    user: str | None = None
    cpus: PositiveCpus | None = None
    memory: MemorySize | None = None
    pull: Literal["never", "if-missing"] = "never"
    stop_signal: str = "SIGTERM"
    stop_grace_seconds: NonNegativeSeconds = 10.0
    timeout_seconds: PositiveSeconds | None = None
    log_limit_bytes: ByteLimit = DEFAULT_LOG_LIMIT_BYTES

    def argv(self) -> list[str] | None:
        if isinstance(self.command, str):
            return ["/bin/sh", "-c", self.command]
        return None if self.command is None else list(self.command)

    def signal_name(self) -> str:
        return _parse_signal(self.stop_signal).name

    def grace_seconds(self) -> int:
        # The engine takes whole seconds; rounding up never cuts the grace short.
        return math.ceil(self.stop_grace_seconds)


def decode_config(raw: Mapping[str, Any]) -> ContainerConfig:
    """Decode a binding config; refuse a bad one as permanent ``invalid_config`` with its $.path."""
    try:
        config = msgspec.convert(dict(raw), ContainerConfig)
        config.signal_name()
        _check_mounts(config.mounts)
    except msgspec.ValidationError as exc:
        raise OperationError(
            "invalid_config", f"container binding config: {exc}", permanent=True
        ) from exc
    return config


def _check_mounts(mounts: list[MountConfig]) -> None:
    for i, mount in enumerate(mounts):
        for field in ("source", "target"):
            path: str = getattr(mount, field)
            # ".." would let a reviewed path name a different directory than it seems to.
            if ".." in path.split("/"):
                raise msgspec.ValidationError(
                    f"path {path!r} must not contain '..' - at `$.mounts[{i}].{field}`"
                )
        # Compare the path the engine will use: "//conduit", "/./conduit" and "/." name the
        # result directory and the root as surely as "/conduit" and "/" do.
        target = "/" + posixpath.normpath(mount.target).lstrip("/")
        if target == "/" or target == RESULT_MOUNT or target.startswith(RESULT_MOUNT + "/"):
            raise msgspec.ValidationError(
                f"target {mount.target!r} would hide the root or the executor's result directory "
                f"{RESULT_MOUNT} - at `$.mounts[{i}].target`"
            )


def _parse_signal(name: str) -> signal.Signals:
    candidate = name.upper()
    if not candidate.startswith("SIG"):
        candidate = "SIG" + candidate
    try:
        return signal.Signals[candidate]
    except KeyError:
        # A ValidationError so decode_config reports it like every other bad field.
        raise msgspec.ValidationError(f"unknown signal {name!r} - at `$.stop_signal`") from None
