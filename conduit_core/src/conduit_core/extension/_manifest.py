"""Plugin manifests: the TOML file every plugin package ships beside its code.

The file is named ``conduit-manifest.toml`` and lives in the plugin's top-level import package
(package data). It declares, per executor, its pool, current generation, the historical
generations still supported and its capabilities; and the plugin's start gates. The core
cross-checks it against what the plugin registers and refuses a mismatch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec

from conduit_core.errors import ManifestError
from conduit_core.extension._executor import Capability
from conduit_core.validation import InvalidValueError, decode_toml

__all__ = [
    "MANIFEST_FILENAME",
    "MANIFEST_SCHEMA_VERSION",
    "ExecutorManifest",
    "GateManifest",
    "Manifest",
    "decode_manifest",
    "load_manifest",
    "manifest_json_schema",
]

MANIFEST_FILENAME = "conduit-manifest.toml"
MANIFEST_SCHEMA_VERSION = 1

Name = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]
Generation = Annotated[int, msgspec.Meta(ge=1)]


class ExecutorManifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One executor as its package declares it."""

    name: Name
    generation: Generation
    pool: Name | None = None
    historical_generations: list[Generation] = []
    capabilities: list[Capability] = []
    description: str = ""
    #: For an out-of-process executor: the command that speaks the wire protocol.
    command: list[str] | None = None

    def generations(self) -> tuple[int, ...]:
        return (self.generation, *self.historical_generations)


class GateManifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One start gate as its package declares it."""

    name: Name
    description: str = ""


class Manifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A plugin package's manifest (``schema`` is the manifest format version)."""

    schema: int
    package: str
    executors: list[ExecutorManifest] = []
    gates: list[GateManifest] = []


def decode_manifest(data: bytes | str, *, source: str) -> Manifest:
    """Decode and validate a manifest; errors name ``source`` and the field's ``$.path``."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        manifest: Manifest = decode_toml(raw, type=Manifest)
    except InvalidValueError as exc:  # too deep or too large: was a RecursionError
        raise ManifestError(f"{source}: {exc.message}", code=exc.code) from exc
    except msgspec.ValidationError as exc:
        raise ManifestError(f"{source}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ManifestError(f"{source}: not valid TOML: {exc}") from exc
    if manifest.schema != MANIFEST_SCHEMA_VERSION:
        raise ManifestError(
            f"{source}: $.schema: manifest schema {manifest.schema} is not supported "
            f"(this conduit reads schema {MANIFEST_SCHEMA_VERSION})"
        )
    _check_unique(manifest, source)
    return manifest


def load_manifest(path: Path) -> Manifest:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read manifest: {exc.strerror}") from exc
    return decode_manifest(data, source=str(path))


def _check_unique(manifest: Manifest, source: str) -> None:
    seen: set[str] = set()
    for i, ex in enumerate(manifest.executors):
        if ex.name in seen:
            raise ManifestError(f"{source}: $.executors[{i}].name: {ex.name!r} is declared twice")
        seen.add(ex.name)
        gens = ex.generations()
        if len(set(gens)) != len(gens):
            raise ManifestError(
                f"{source}: $.executors[{i}].historical_generations: repeats a generation of "
                f"{ex.name!r} ({', '.join(map(str, gens))})"
            )
    gates: set[str] = set()
    for i, gate in enumerate(manifest.gates):
        if gate.name in gates:
            raise ManifestError(f"{source}: $.gates[{i}].name: {gate.name!r} is declared twice")
        gates.add(gate.name)


def manifest_json_schema() -> dict[str, Any]:
    """The JSON Schema of the manifest format (kept in ``manifests/`` by a test)."""
    schema: dict[str, Any] = msgspec.json.schema(Manifest)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "conduit plugin manifest"
    return schema
