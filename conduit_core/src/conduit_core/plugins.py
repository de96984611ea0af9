"""Plugin loading: a typed façade over pluggy's PluginManager.

The rest of the core asks this module (``plugins.executor(name, generation)``,
``plugins.start_gates()``, …) and never calls ``pm.hook`` itself. Load order: blocked names, entry
points of group ``conduit``, then built-ins through the same path, then ``check_pending()``.
Every plugin's manifest is cross-checked against what it registers; duplicates are errors.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import import_module, resources
from types import ModuleType
from typing import Any

import importlib_metadata
import msgspec
import pluggy

from conduit_core.errors import (
    ConduitError,
    DuplicateRegistrationError,
    ManifestError,
    PluginLoadError,
    UnsupportedGenerationError,
)
from conduit_core.extension import (
    MANIFEST_FILENAME,
    PROJECT_NAME,
    Executor,
    ExecutorManifest,
    ExecutorRegistration,
    GateRegistration,
    HookSpecs,
    Manifest,
    Result,
    RetryHint,
    ScheduleSource,
    decode_manifest,
)
from conduit_core.remote import ProgramSpec, ProgramSupervisor, load_remote

__all__ = ["DISABLED_ENV", "ExecutorInfo", "GateInfo", "LoadedPlugin", "Plugins"]

#: Comma-separated entry names an operator blocks from loading.
DISABLED_ENV = "CONDUIT_DISABLED_PLUGINS"


@dataclass(frozen=True)
class LoadedPlugin:
    name: str  # the entry point name
    package: str  # the distribution that installed it
    module: ModuleType
    manifest: Manifest
    manifest_path: str


@dataclass(frozen=True)
class ExecutorInfo:
    """An installed executor, as ``conduit plugins list`` shows it."""

    name: str
    package: str
    plugin: str
    pool: str | None
    generation: int
    historical_generations: tuple[int, ...]
    capabilities: tuple[str, ...]
    manifest: ExecutorManifest = field(repr=False, compare=False)
    #: The config file of an ``[executors.NAME]`` program (``package`` is then that file too).
    declared_in: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "package": self.package,
            "plugin": self.plugin,
            "pool": self.pool,
            "generation": self.generation,
            "historical_generations": list(self.historical_generations),
            "capabilities": list(self.capabilities),
            # An out-of-process executor's program (resolved), else null.
            "command": None if self.manifest.command is None else list(self.manifest.command),
            "declared_in": self.declared_in,
        }


@dataclass(frozen=True)
class GateInfo:
    name: str
    package: str
    plugin: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "package": self.package, "plugin": self.plugin}


def disabled_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    raw = (environ if environ is not None else os.environ).get(DISABLED_ENV, "")
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


class Plugins:
    """The loaded plugins, their manifests and the generation registry."""

    def __init__(
        self,
        pm: pluggy.PluginManager,
        loaded: Sequence[LoadedPlugin],
        programs: Mapping[str, ProgramSpec] | None = None,
    ) -> None:
        self._pm = pm
        self._loaded = tuple(loaded)
        self._executors: dict[tuple[str, int], Executor] = {}
        self._config_checks: dict[tuple[str, int], Callable[[Mapping[str, Any]], object]] = {}
        self._binding_checks: dict[tuple[str, int], Callable[[Mapping[str, Any]], object]] = {}
        self._infos: dict[str, ExecutorInfo] = {}
        self._gates: dict[str, GateRegistration] = {}
        self._gate_infos: dict[str, GateInfo] = {}
        self._programs: dict[str, ProgramSupervisor] = {}
        self._config_types: dict[str, type[msgspec.Struct]] = {}
        for plugin in self._loaded:
            self._register_plugin(plugin)
            self._register_config_type(plugin)
        for name, spec in sorted((programs or {}).items()):
            self._register_program(name, spec)

    # --- loading ------------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        *,
        disabled: Iterable[str] | None = None,
        builtins: Sequence[tuple[str, str, ModuleType]] = (),
        programs: Mapping[str, ProgramSpec] | None = None,
    ) -> Plugins:
        """Load every installed plugin (entry point group ``conduit``) not blocked by name.

        ``builtins`` are (name, package, module) loaded through the same path, after the entry
        points. ``disabled`` defaults to ``CONDUIT_DISABLED_PLUGINS``. ``programs`` are the
        out-of-process executors conduit.toml declares (``[executors.NAME]``), by name.
        """
        blocked = disabled_from_env() if disabled is None else frozenset(disabled)
        pm = pluggy.PluginManager(PROJECT_NAME)
        pm.add_hookspecs(HookSpecs)
        for name in sorted(blocked):
            pm.set_blocked(name)
        loaded: list[LoadedPlugin] = []
        eps = sorted(importlib_metadata.entry_points(group=PROJECT_NAME), key=lambda e: e.name)
        for ep in eps:
            if pm.is_blocked(ep.name):
                continue
            package = ep.dist.name if ep.dist is not None else "(unknown distribution)"
            try:
                obj = ep.load()
            except Exception as exc:
                raise PluginLoadError(
                    f"plugin {ep.name!r} from package {package!r} failed to import "
                    f"{ep.value!r}: {type(exc).__name__}: {exc}"
                ) from exc
            if not isinstance(obj, ModuleType):
                raise PluginLoadError(
                    f"plugin {ep.name!r} from package {package!r}: entry point {ep.value!r} "
                    "must name a module"
                )
            loaded.append(_load_plugin(pm, ep.name, package, obj))
        for name, package, module in builtins:
            if not pm.is_blocked(name):
                loaded.append(_load_plugin(pm, name, package, module))
        try:
            pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginLoadError(f"a plugin implements an unknown hook: {exc}") from exc
        programs = {n: p for n, p in (programs or {}).items() if n not in blocked}
        return cls(pm, loaded, programs)

    def _register_plugin(self, plugin: LoadedPlugin) -> None:
        regs = _call_registration_hook(self._pm, plugin, "conduit_executors")
        gates = _call_registration_hook(self._pm, plugin, "conduit_start_gates")
        where = f"package {plugin.package!r} (manifest {plugin.manifest_path})"
        declared = {ex.name: (i, ex) for i, ex in enumerate(plugin.manifest.executors)}
        regs = regs + self._remote_registrations(plugin, regs, where)
        seen: set[tuple[str, int]] = set()
        for reg in regs:
            if not isinstance(reg, ExecutorRegistration):
                raise PluginLoadError(
                    f"{where}: conduit_executors returned {type(reg).__name__}, "
                    "expected ExecutorRegistration"
                )
            key = (reg.name, reg.generation)
            if key in seen:
                raise DuplicateRegistrationError(
                    f"{where} registers executor {reg.name!r} generation {reg.generation} twice"
                )
            seen.add(key)
            if reg.name not in declared:
                raise ManifestError(
                    f"{where}: registers executor {reg.name!r} but $.executors declares no "
                    "executor of that name"
                )
            idx, ex = declared[reg.name]
            if reg.generation not in ex.generations():
                raise ManifestError(
                    f"{where}: registers executor {reg.name!r} generation {reg.generation} but "
                    f"$.executors[{idx}] declares generation {ex.generation} and "
                    f"historical_generations {list(ex.historical_generations)}"
                )
            if not isinstance(reg.executor, Executor):
                raise PluginLoadError(
                    f"{where}: executor {reg.name!r} generation {reg.generation} is a "
                    f"{type(reg.executor).__name__}, not a conduit_core.extension.Executor"
                )
        for name, (idx, ex) in declared.items():
            missing = [g for g in ex.generations() if (name, g) not in seen]
            if missing:
                raise ManifestError(
                    f"{where}: $.executors[{idx}] declares executor {name!r} generation(s) "
                    f"{missing} but the package registers no implementation for them"
                )
            if name in self._infos:
                other = self._infos[name].package
                raise DuplicateRegistrationError(
                    f"executor {name!r} is registered by two packages: {other!r} and "
                    f"{plugin.package!r}; uninstall one or block it with {DISABLED_ENV}"
                )
            self._infos[name] = ExecutorInfo(
                name=name,
                package=plugin.package,
                plugin=plugin.name,
                pool=ex.pool,
                generation=ex.generation,
                historical_generations=tuple(ex.historical_generations),
                capabilities=tuple(str(c) for c in ex.capabilities),
                manifest=ex,
            )
        for reg in regs:
            self._executors[(reg.name, reg.generation)] = reg.executor
            if reg.check_config is not None:
                self._config_checks[(reg.name, reg.generation)] = reg.check_config
            if reg.check_binding is not None:
                self._binding_checks[(reg.name, reg.generation)] = reg.check_binding
        self._register_gates(plugin, gates, where)

    def _remote_registrations(
        self, plugin: LoadedPlugin, regs: Sequence[Any], where: str
    ) -> list[ExecutorRegistration]:
        """Proxies for the manifest's executors with a ``command`` (out-of-process programs)."""
        registered = {getattr(reg, "name", None) for reg in regs}
        out: list[ExecutorRegistration] = []
        for idx, ex in enumerate(plugin.manifest.executors):
            if ex.command is None:
                continue
            if ex.name in registered:
                raise ManifestError(
                    f"{where}: $.executors[{idx}].command: executor {ex.name!r} is also "
                    "registered in process; declare a command only for an out-of-process program"
                )
            remote = load_remote(
                ex.name, ProgramSpec(command=tuple(ex.command)),
                where=f"{where}: $.executors[{idx}]", declared=ex,
            )  # fmt: skip
            self._programs[ex.name] = remote.supervisor
            out.extend(remote.registrations)
        return out

    def _register_program(self, name: str, spec: ProgramSpec) -> None:
        """An executor program conduit.toml declares: its manifest is its handshake."""
        where = f"{spec.source or 'conduit.toml'}: [executors.{name}]"
        if name in self._infos:
            raise DuplicateRegistrationError(
                f"{where}: executor {name!r} is already registered by package "
                f"{self._infos[name].package!r}"
            )
        remote = load_remote(name, spec, where=where, declared=None)
        ex = remote.manifest
        self._infos[name] = ExecutorInfo(
            name=name, package=spec.source or "conduit.toml", plugin=f"executors.{name}",
            pool=ex.pool, generation=ex.generation,
            historical_generations=tuple(ex.historical_generations),
            capabilities=tuple(str(c) for c in ex.capabilities), manifest=ex,
            declared_in=spec.source,
        )  # fmt: skip
        self._programs[name] = remote.supervisor
        for reg in remote.registrations:
            self._executors[(reg.name, reg.generation)] = reg.executor
            if reg.check_config is not None:
                self._config_checks[(reg.name, reg.generation)] = reg.check_config

    def programs(self) -> list[ProgramSupervisor]:
        """The out-of-process executors' supervisors (``conduit doctor`` shows their state)."""
        return [self._programs[name] for name in sorted(self._programs)]

    async def close(self) -> None:
        """Shut down the executor programs this registry started (their jobs keep running)."""
        for supervisor in self._programs.values():
            await supervisor.close()

    def _register_gates(self, plugin: LoadedPlugin, gates: Sequence[Any], where: str) -> None:
        declared = {g.name for g in plugin.manifest.gates}
        names: set[str] = set()
        for reg in gates:
            if not isinstance(reg, GateRegistration):
                raise PluginLoadError(
                    f"{where}: conduit_start_gates returned {type(reg).__name__}, "
                    "expected GateRegistration"
                )
            if reg.name not in declared:
                raise ManifestError(
                    f"{where}: registers gate {reg.name!r} but $.gates does not declare it"
                )
            if reg.name in self._gates or reg.name in names:
                other = self._gate_infos[reg.name].package if reg.name in self._gates else None
                raise DuplicateRegistrationError(
                    f"gate {reg.name!r} is registered by two packages: {other or plugin.package!r}"
                    f" and {plugin.package!r}"
                )
            names.add(reg.name)
            self._gates[reg.name] = reg
            self._gate_infos[reg.name] = GateInfo(reg.name, plugin.package, plugin.name)
        missing = sorted(declared - names)
        if missing:
            raise ManifestError(
                f"{where}: $.gates declares {missing} but the package registers no such gate"
            )

    def _register_config_type(self, plugin: LoadedPlugin) -> None:
        impls = _impls_of(self._pm, plugin, "conduit_config_type")
        for impl in impls:
            try:
                typ = _call_impl(impl)
            except Exception as exc:
                raise PluginLoadError(
                    f"package {plugin.package!r}: hook conduit_config_type raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if typ is None:
                continue
            if not (isinstance(typ, type) and issubclass(typ, msgspec.Struct)):
                raise PluginLoadError(
                    f"package {plugin.package!r}: conduit_config_type returned {typ!r}, "
                    "expected a msgspec.Struct type"
                )
            self._config_types[plugin.name] = typ

    # --- plugin config ([plugins.NAME] in conduit.toml) ---------------------------------------

    def config_type(self, plugin: str) -> type[msgspec.Struct] | None:
        """The Struct type plugin ``plugin`` decodes its ``[plugins.NAME]`` table with.

        Raises ``ConduitError`` ``unknown_plugin`` for a name no loaded plugin has.
        """
        names = sorted(p.name for p in self._loaded)
        if plugin not in names:
            raise ConduitError(
                f"no plugin {plugin!r} is loaded (loaded: {', '.join(names) or 'none'}; a "
                f"plugin blocked by {DISABLED_ENV} is not loaded)",
                code="unknown_plugin",
            )
        return self._config_types.get(plugin)

    def configure(self, configs: Mapping[str, object]) -> None:
        """Hand every loaded plugin its decoded config (``None`` when the file has none).

        Raises ``ConduitError`` ``plugin_config_refused`` when a plugin's hook raises.
        """
        for impl in self._pm.hook.conduit_configure.get_hookimpls():
            try:
                _call_impl(impl, config=configs.get(impl.plugin_name))
            except Exception as exc:
                raise ConduitError(
                    f"plugin {impl.plugin_name!r} refused its [plugins.{impl.plugin_name}] "
                    f"config: {type(exc).__name__}: {exc}",
                    code="plugin_config_refused",
                ) from exc

    # --- queries ------------------------------------------------------------------------------

    @property
    def loaded(self) -> tuple[LoadedPlugin, ...]:
        return self._loaded

    def executors(self) -> list[ExecutorInfo]:
        return [self._infos[name] for name in sorted(self._infos)]

    def executor_info(self, name: str) -> ExecutorInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise ConduitError(
                f"unknown executor {name!r}; installed: {', '.join(sorted(self._infos)) or 'none'}",
                code="unknown_executor",
            ) from None

    def executor(self, name: str, generation: int) -> Executor:
        """The implementation of exactly this generation; never another one."""
        try:
            return self._executors[(name, generation)]
        except KeyError:
            installed = tuple(sorted(g for (n, g) in self._executors if n == name))
            raise UnsupportedGenerationError(name, generation, installed=installed) from None

    def check_binding_config(self, name: str, generation: int, config: Mapping[str, Any]) -> None:
        """Decode a binding config with the executor generation's declared check, if it has one.

        Raises the executor's ``OperationError`` (``invalid_config``) for a bad config; any other
        error of the check is reported as ``invalid_config`` too, never as a crash.
        """
        _run_check(
            self._config_checks.get((name, generation)), config,
            f"executor {name!r} generation {generation} refused the binding config",
        )  # fmt: skip

    def check_binding_deeply(self, name: str, generation: int, config: Mapping[str, Any]) -> None:
        """The executor generation's deeper binding check (``conduit config check`` only).

        Raises the executor's ``ConduitError`` with its own code; any other error of the check
        is reported as ``invalid_config``, never as a crash.
        """
        _run_check(
            self._binding_checks.get((name, generation)), config,
            f"executor {name!r} generation {generation} could not check the binding",
        )  # fmt: skip

    def gates(self) -> list[GateInfo]:
        return [self._gate_infos[name] for name in sorted(self._gate_infos)]

    def start_gates(self) -> list[GateRegistration]:
        """Start gates in registration-name order (the order they are asked in)."""
        return [self._gates[name] for name in sorted(self._gates)]

    def run_environment(self, scope_chain: Sequence[str]) -> dict[str, str]:
        """Merge every plugin's run environment for the scope chain (root first).

        Raises :class:`ConduitError` ``environment_unavailable``; the message never carries a
        value, only variable and plugin names.
        """
        merged: dict[str, str] = {}
        origin: dict[str, str] = {}
        for impl in self._pm.hook.conduit_run_environment.get_hookimpls():
            try:
                env = _call_impl(impl, scope_chain=tuple(scope_chain))
            except Exception as exc:
                raise ConduitError(
                    f"run environment from plugin {impl.plugin_name!r} failed: "
                    f"{type(exc).__name__}",
                    code="environment_unavailable",
                ) from exc
            if env is None:
                continue
            for key, value in env.items():
                if key in merged and merged[key] != value:
                    raise ConduitError(
                        f"run environment variable {key!r} is set differently by plugins "
                        f"{origin[key]!r} and {impl.plugin_name!r}",
                        code="environment_unavailable",
                    )
                merged[key] = value
                origin[key] = impl.plugin_name
        return merged

    def schedule_sources(self, *, reserved: Sequence[str] = ()) -> list[ScheduleSource]:
        """Every plugin's schedule sources; a name taken twice (or ``reserved``) is an error."""
        sources: list[ScheduleSource] = []
        owners: dict[str, str] = {name: "conduit-core" for name in reserved}
        for impl in self._pm.hook.conduit_schedule_sources.get_hookimpls():
            try:
                found = _call_impl(impl) or []
            except Exception as exc:
                raise PluginLoadError(
                    f"plugin {impl.plugin_name!r}: conduit_schedule_sources raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            for source in found:
                if not isinstance(source, ScheduleSource):
                    raise PluginLoadError(
                        f"plugin {impl.plugin_name!r}: conduit_schedule_sources returned "
                        f"{type(source).__name__}, not a ScheduleSource"
                    )
                if ":" in source.name or source.name in owners:
                    raise DuplicateRegistrationError(
                        f"schedule source {source.name!r} of plugin {impl.plugin_name!r} is "
                        f"taken (by {owners.get(source.name, 'nobody')!r}) or contains ':'"
                    )
                owners[source.name] = impl.plugin_name
                sources.append(source)
        return sources

    def retry_hint(
        self, executor: str, error: BaseException | None, result: Result | None
    ) -> RetryHint | None:
        """Ask every plugin to classify a failure; the latest reset wins."""
        hints: list[RetryHint] = []
        for impl in self._pm.hook.conduit_retry_hint.get_hookimpls():
            hint = _call_impl(impl, executor=executor, error=error, result=result)
            if hint is not None:
                hints.append(hint)
        if not hints:
            return None
        return max(hints, key=_hint_order)


def _hint_order(hint: RetryHint) -> tuple[int, int]:
    # An unknown reset means the default 30-minute delay; a known one sorts by instant.
    return (0 if hint.unknown_reset else 1, hint.reset_at_ms or 0)


def _load_plugin(
    pm: pluggy.PluginManager, name: str, package: str, module: ModuleType
) -> LoadedPlugin:
    manifest, path = _read_manifest(name, package, module)
    try:
        pm.register(module, name=name)
    except (ValueError, pluggy.PluginValidationError) as exc:
        raise PluginLoadError(f"plugin {name!r} from package {package!r}: {exc}") from exc
    return LoadedPlugin(name, package, module, manifest, path)


def _read_manifest(name: str, package: str, module: ModuleType) -> tuple[Manifest, str]:
    top = module.__name__.split(".", 1)[0]
    resource = resources.files(import_module(top)).joinpath(MANIFEST_FILENAME)
    path = str(resource)
    if not resource.is_file():
        raise ManifestError(
            f"package {package!r} (plugin {name!r}) ships no {MANIFEST_FILENAME} in its "
            f"package {top!r}; expected {path}"
        )
    manifest = decode_manifest(resource.read_bytes(), source=path)
    if _normalize(manifest.package) != _normalize(package):
        raise ManifestError(
            f"{path}: $.package: says {manifest.package!r} but the file is installed by "
            f"package {package!r}"
        )
    return manifest, path


def _normalize(dist: str) -> str:
    return dist.lower().replace("_", "-").replace(".", "-")


def _impls_of(pm: pluggy.PluginManager, plugin: LoadedPlugin, hook: str) -> list[Any]:
    return [i for i in getattr(pm.hook, hook).get_hookimpls() if i.plugin_name == plugin.name]


def _call_registration_hook(pm: pluggy.PluginManager, plugin: LoadedPlugin, hook: str) -> list[Any]:
    impls = _impls_of(pm, plugin, hook)
    out: list[Any] = []
    for impl in impls:
        try:
            result = _call_impl(impl)
        except Exception as exc:
            raise PluginLoadError(
                f"package {plugin.package!r}: hook {hook} raised {type(exc).__name__}: {exc}"
            ) from exc
        if result is None:
            continue
        if not isinstance(result, list | tuple):
            raise PluginLoadError(
                f"package {plugin.package!r}: hook {hook} must return a list, got "
                f"{type(result).__name__}"
            )
        out.extend(result)
    return out


def _call_impl(impl: Any, **kwargs: Any) -> Any:
    # Implementations take only the hook arguments they name (pluggy's contract).
    return impl.function(*(kwargs[arg] for arg in impl.argnames))


def _run_check(
    check: Callable[[Mapping[str, Any]], object] | None, config: Mapping[str, Any], what: str
) -> None:
    """Run an executor's binding check: its ``ConduitError`` as raised, anything else as
    ``invalid_config`` saying ``what`` failed, never as a crash."""
    if check is None:
        return
    try:
        check(config)
    except ConduitError:
        raise
    except Exception as exc:
        raise ConduitError(f"{what}: {type(exc).__name__}: {exc}", code="invalid_config") from exc
