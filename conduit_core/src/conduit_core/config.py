"""``conduit.toml``: decoded into msgspec Structs with errors that name the key path.

The loader is pure: it reads a file (or bytes) and returns a :class:`Config` with a content
``digest``; the store maps digests to monotonically increasing config generations.
:func:`check_against_plugins` then checks what needs the installed plugins (executor names,
pinned generations).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec

from conduit_core.errors import ConduitError, ConfigError, UnsupportedGenerationError
from conduit_core.validation import (
    MAX_AMOUNT,
    MAX_SECONDS,
    MAX_THEN_STEPS,
    NAME_PATTERN,
    ROUTINE_ID_PATTERN,
    Duration,
    InvalidValueError,
    Priority,
    check_name,
    check_timezone,
    concurrency_key_fields,
    decode_toml,
    duration_ms,
    key_template_fields,
)

if TYPE_CHECKING:  # loading a config (every CLI command does) needs neither
    from conduit_core.plugins import Plugins
    from conduit_core.remote import ProgramSpec

__all__ = [
    "Binding",
    "Budget",
    "Config",
    "HttpSettings",
    "MetricsSettings",
    "Pool",
    "RoutineSpec",
    "Scope",
    "ScopeLimits",
    "Settings",
    "TokenSpec",
    "TracingSettings",
    "check_against_plugins",
    "check_bindings_deeply",
    "load_config",
    "parse_config",
    "plugin_configs",
]

T = TypeVar("T")

# Every number is bounded above as well as below: ``inf``, ``nan`` and 1e306 are valid TOML
# floats, and each once wedged the daemon (OverflowError in lease or timer arithmetic).
Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0, le=MAX_SECONDS)]
Delay = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
Unit = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
#: A host label (``settings.labels``, a binding's ``requires``): letters, digits, ``_ . : / -``.
LABEL_PATTERN = r"^[A-Za-z0-9_.:/-]{1,64}$"
_LABEL = re.compile(LABEL_PATTERN)

ROOT_SCOPE = "root"
MAX_RETRY_DELAYS = 100


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class HttpSettings(_Section, frozen=True, kw_only=True):
    listen: str = "127.0.0.1:8765"
    unix_socket: str | None = None
    token_file: str | None = None
    #: A request body over this many bytes is refused with 413 before it is buffered; the
    #: default is ``validation.MAX_BODY_BYTES`` (2 MiB: a 1 MiB payload and its envelope).
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 30)] = 2 * 1024 * 1024
    #: Wrong tokens one client address may present within a minute before it is refused for a
    #: while (429, docs/http.md "Tokens and roles"); 0 never refuses.
    wrong_token_limit: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 10


class MetricsSettings(_Section, frozen=True, kw_only=True):
    """``[settings.metrics]``: the ``/metrics`` endpoint (docs/metrics.md)."""

    #: Serve ``/metrics`` without the API token (for a scraper that cannot send one); every
    #: other path still wants it. Like every HTTP setting it changes only on restart.
    open: bool = False


class TracingSettings(_Section, frozen=True, kw_only=True):
    """``[settings.tracing]``: OpenTelemetry traces of attempts (needs ``conduit-core[otel]``)."""

    enabled: bool = False
    #: ``otlp``: the SDK's OTLP/HTTP exporter, configured by the standard ``OTEL_EXPORTER_OTLP_*``
    #: variables; ``console``: spans printed to stdout; ``global``: the process's own tracer
    #: provider (``opentelemetry-instrument`` or an embedding application sets it up).
    exporter: Literal["otlp", "console", "global"] = "otlp"
    service_name: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = "conduit"


class Settings(_Section, frozen=True, kw_only=True):
    #: Store URL: a SQLite file path or ``sqlite:///path``, or ``postgresql://…``; relative to the
    #: config file. Unset: ``conduit.db`` in ``data_dir``.
    store: str | None = None
    #: Where executors keep workspaces and the daemon its token and pid; relative to the config
    #: file. Unset: a per-user state folder for this config (``$XDG_STATE_HOME/conduit/…``), so
    #: run state never lands in a source tree.
    data_dir: str | None = None
    #: Attempts of executors without a pool (agent turns and the like).
    concurrency: PositiveInt = 4
    #: Attempts of executors in pool ``jobs`` (shell, container).
    job_concurrency: PositiveInt = 4
    lease_seconds: PositiveSeconds = 60.0
    timeout_seconds: PositiveSeconds = 3600.0
    #: Default delays between failures: three attempts in total.
    retry_delays_seconds: list[Delay] = msgspec.field(default_factory=lambda: [300.0, 600.0])
    #: How long before its due instant the ticker claims a Routine's fire (it still fires at the
    #: instant): the claim's own time is paid before the instant. 0 claims at the instant.
    routine_claim_ahead_seconds: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.5
    #: How long the daemon gives one stop, interrupt or inject it starts on its own; each runs
    #: off the host loop's pass, so only that attempt waits (tried again after a backoff).
    executor_call_timeout_seconds: PositiveSeconds = 60.0
    #: What this daemon's host has (``["gpu", "eu"]``): it starts only the Work of bindings
    #: whose ``requires`` are all among them (see docs/daemon.md, "Host labels").
    labels: list[str] = msgspec.field(default_factory=list)
    http: HttpSettings = HttpSettings()
    metrics: MetricsSettings = MetricsSettings()
    tracing: TracingSettings = TracingSettings()


class ScopeLimits(_Section, frozen=True, kw_only=True):
    concurrency: PositiveInt | None = None


class Pool(_Section, frozen=True, kw_only=True):
    """``[pools.NAME]``: an executor pool's limit (``jobs`` has ``settings.job_concurrency``)."""

    concurrency: PositiveInt


class ExecutorProgram(_Section, frozen=True, kw_only=True):
    """``[executors.NAME]``: an out-of-process executor program (docs/wire-protocol.md).

    Its manifest (generations, pool, capabilities) comes from the program's handshake.
    """

    command: Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(min_length=1)]
    handshake_timeout_seconds: PositiveSeconds = 30.0
    #: run / recover / stop / inject must be answered within this (``wait`` has no limit).
    request_timeout_seconds: PositiveSeconds = 120.0
    #: Callbacks one attempt (one run / resume / recover request) may make, refused included.
    callbacks_per_attempt: PositiveInt = 1000
    #: Callbacks per second one attempt may make on average (bursts of as many allowed).
    callbacks_per_second: Annotated[float, msgspec.Meta(ge=1, le=1_000_000)] = 100.0
    #: Callbacks of the program being recorded at once; past it the daemon stops reading it.
    callbacks_in_flight: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 256
    #: Refused callbacks of the program per second (on average); past it the daemon reads the
    #: program's output only as fast as this.
    callbacks_refused_per_second: Annotated[float, msgspec.Meta(ge=1, le=1_000_000)] = 2000.0
    #: The longest wait before a program that keeps dying is started again (0.1 s doubling; 1 s
    #: doubling after a start that failed before its handshake).
    restart_backoff_max_seconds: PositiveSeconds = 10.0

    def spec(self, source: str) -> ProgramSpec:
        """How to run it; a relative path in ``command[0]`` is relative to the folder of
        ``source`` (the config file), as ``settings.store`` is."""
        from conduit_core.remote import CallbackLimits, ProgramSettings, ProgramSpec

        settings = ProgramSettings(
            handshake_timeout=self.handshake_timeout_seconds,
            request_timeout=self.request_timeout_seconds,
            callbacks=CallbackLimits(
                per_attempt=self.callbacks_per_attempt,
                per_second=self.callbacks_per_second,
                in_flight=self.callbacks_in_flight,
                refused_per_second=self.callbacks_refused_per_second,
            ),
            backoff_max=self.restart_backoff_max_seconds,
        )
        first = self.command[0]
        if os.sep in first and not os.path.isabs(first):
            first = os.path.normpath(os.path.join(Path(source).resolve().parent, first))
        return ProgramSpec(
            command=(first, *self.command[1:]), settings=settings, source=source,
            written=tuple(self.command),
        )  # fmt: skip


class Scope(_Section, frozen=True, kw_only=True):
    parent: str | None = None
    limits: ScopeLimits = ScopeLimits()
    description: str = ""


class DebounceSpec(_Section, frozen=True, kw_only=True):
    """``debounce = { key = "…", quiet = "5s", max_wait = "1m" }``: submits with one key within
    ``quiet`` of each other become one Work, started ``quiet`` after the last of them but never
    later than ``max_wait`` after the first (default: no maximum beyond ``quiet`` pushes)."""

    key: str
    quiet: Duration
    max_wait: Duration | None = None


class Binding(_Section, frozen=True, kw_only=True):
    executor: Name
    #: Pin new attempts to this generation (default: the executor's current generation).
    generation: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] | None = None
    scope: str = ROOT_SCOPE
    config: dict[str, Any] = {}
    timeout_seconds: PositiveSeconds | None = None
    retry_delays_seconds: list[Delay] | None = None
    terminal_on_exhaustion: bool = False
    control_fallback: Literal["queue", "drop"] = "queue"
    handoff: Literal["stop", "continue"] = "stop"
    #: Host labels a daemon must have (``settings.labels``) to start this binding's Work.
    requires: list[str] = msgspec.field(default_factory=list)
    #: Claim order of its Work (higher first, aged: docs/runtime.md); a submit may set its own.
    priority: Priority = 0
    #: A template over the first input (``"{customer}"``): at most ``key_limit`` attempts of
    #: Work with one rendered key hold a slot at once, across every daemon.
    concurrency_key: str | None = None
    key_limit: Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)] = 1
    #: What its Work does when a dependency (``after``) fails or is cancelled, unless the
    #: submit says (see docs/dependencies.md).
    on_dependency_failure: Literal["cancel", "hold", "run"] = "cancel"
    #: A dedup key for every submit without one: a template over the first input
    #: (``"order-{order_id}"``; docs/dedup.md), kept for the ``dedup`` scope below.
    dedup_key: str | None = None
    dedup: Literal["queued", "active"] = "queued"
    #: Instead of ``dedup``: a duplicate is any Work with the key created within this span.
    dedup_window: Duration | None = None
    #: Collapse submits whose key matches into one pending Work (docs/dedup.md).
    debounce: DebounceSpec | None = None


class RoutineStepSpec(_Section, frozen=True, kw_only=True):
    """``[[routines.then]]``: a Work the fire creates after the one before it."""

    binding: str
    scope: str | None = None
    kind: Literal["task", "standing", "run_once"] = "task"
    input: Any = None


class RoutineSpec(_Section, frozen=True, kw_only=True):
    id: Annotated[str, msgspec.Meta(pattern=ROUTINE_ID_PATTERN)]
    cron: str
    binding: str
    scope: str | None = None
    timezone: str = "UTC"
    kind: Literal["task", "standing", "run_once"] = "task"
    input: Any = None
    misfire: Literal["coalesce", "skip"] = "coalesce"
    grace_seconds: Delay = 60.0
    #: More Work each fire creates, each after the one before (docs/routines.md, "Groups").
    then: Annotated[list[RoutineStepSpec], msgspec.Meta(max_length=MAX_THEN_STEPS)] = []


class Budget(_Section, frozen=True, kw_only=True):
    name: Name
    unit: Unit
    max: Annotated[float, msgspec.Meta(ge=0, le=MAX_AMOUNT)]
    per: Literal["work", "scope", "all"] = "work"
    period: Literal["life", "day", "week"] = "life"
    scope: str | None = None
    warn_at: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None


class TokenSpec(_Section, frozen=True, kw_only=True):
    """``[[tokens]]``: a named API token with a role (docs/http.md, "Tokens and roles"). The
    file holds the token (mode 0600, like the daemon's own token file); conduit never stores
    or logs the token, only its name."""

    name: Name
    role: Literal["viewer", "operator", "admin"]
    file: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


class Config(msgspec.Struct, frozen=True, kw_only=True):
    settings: Settings
    scopes: dict[str, Scope]
    bindings: dict[str, Binding]
    routines: list[RoutineSpec]
    budgets: list[Budget]
    source: str
    pools: dict[str, Pool] = {}
    executors: dict[str, ExecutorProgram] = {}
    #: ``[plugins.NAME]`` tables as written; each plugin's own type decodes its table
    #: (:func:`plugin_configs`), since only the installed plugins know their schema.
    plugins: dict[str, dict[str, Any]] = {}
    #: Named API tokens; like every HTTP setting they apply at the daemon's start (not digested).
    tokens: list[TokenSpec] = []
    digest: str

    def programs(self) -> dict[str, ProgramSpec]:
        """The out-of-process executors this file declares, for ``Plugins.load(programs=…)``."""
        return {name: program.spec(self.source) for name, program in self.executors.items()}

    def scope_chain(self, scope: str) -> tuple[str, ...]:
        """The scope and its ancestors, root first."""
        chain: list[str] = []
        current: str | None = scope
        while current is not None:
            chain.append(current)
            current = self.scopes[current].parent if current in self.scopes else None
        return tuple(reversed(chain))


_TOP_LEVEL = {
    "settings", "scopes", "bindings", "routines", "budgets", "pools", "executors", "plugins",
    "tokens",
}  # fmt: skip
#: The pool whose limit is ``settings.job_concurrency`` (shell, container).
JOBS_POOL = "jobs"
_EXECUTOR_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def load_config(path: str | Path) -> Config:
    """Read and validate a config file. Nothing is loaded unless all of it is valid."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read config: {exc.strerror}") from exc
    return parse_config(data, source=str(file))


def parse_config(data: bytes | str, *, source: str = "conduit.toml") -> Config:
    raw_bytes = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    try:
        raw = decode_toml(raw_bytes)
    except InvalidValueError as exc:
        raise ConfigError(f"{source}: {exc.message}", code=exc.code) from exc
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: $: expected a table")
    unknown = sorted(set(raw) - _TOP_LEVEL)
    if unknown:
        raise ConfigError(
            f"{source}: $.{unknown[0]}: unknown key "
            f"(expected one of: {', '.join(sorted(_TOP_LEVEL))})"
        )
    settings = _convert(raw.get("settings", {}), Settings, "$.settings", source)
    scopes = _convert_table(raw.get("scopes", {}), Scope, "$.scopes", source)
    bindings = _convert_table(raw.get("bindings", {}), Binding, "$.bindings", source)
    routines = _convert_list(raw.get("routines", []), RoutineSpec, "$.routines", source)
    budgets = _convert_list(raw.get("budgets", []), Budget, "$.budgets", source)
    tokens = _convert_list(raw.get("tokens", []), TokenSpec, "$.tokens", source)
    _check_tokens(tokens, source)
    pools = _convert_table(raw.get("pools", {}), Pool, "$.pools", source)
    executors = _convert_table(raw.get("executors", {}), ExecutorProgram, "$.executors", source)
    for name in executors:
        if not _EXECUTOR_NAME.match(name):
            raise ConfigError(
                f"{source}: $.executors.{name}: an executor name is a lower-case letter, then up "
                "to 62 lower-case letters, digits, '-' or '_'"
            )
    plugin_tables = _convert_table(raw.get("plugins", {}), dict[str, Any], "$.plugins", source)
    if JOBS_POOL in pools:
        raise ConfigError(
            f"{source}: $.pools.{JOBS_POOL}: the jobs pool's limit is settings.job_concurrency",
            code="invalid_pool",
        )
    if len(settings.retry_delays_seconds) > MAX_RETRY_DELAYS:
        raise ConfigError(
            f"{source}: $.settings.retry_delays_seconds: at most {MAX_RETRY_DELAYS} delays"
        )
    _check_store(settings.store, source)
    _check_labels(settings.labels, "$.settings.labels", source)
    for name, binding in bindings.items():
        _check_labels(binding.requires, f"{_path('$.bindings', name)}.requires", source)
    scopes = {ROOT_SCOPE: Scope(), **scopes}
    _check_scopes(scopes, source)
    _check_bindings(bindings, scopes, source)
    _check_routines(routines, bindings, scopes, source)
    _check_budgets(budgets, scopes, source)
    # pools, executors, plugins and the later settings join the digest only when declared, so
    # existing configs keep their digest (and config generation).
    digested: list[Any] = [
        _digested(settings), scopes, _digested_bindings(bindings), _digested_routines(routines),
        budgets,
    ]
    if pools:
        digested.append(pools)
    if executors:
        digested.append({"executors": executors})
    if plugin_tables:
        digested.append({"plugins": plugin_tables})
    digest = hashlib.sha256(msgspec.json.encode(digested, order="sorted")).hexdigest()
    return Config(
        settings=settings,
        scopes=scopes,
        bindings=bindings,
        routines=routines,
        budgets=budgets,
        pools=pools,
        executors=executors,
        plugins=plugin_tables,
        tokens=tokens,
        source=source,
        digest=digest,
    )


def _check_tokens(tokens: list[TokenSpec], source: str) -> None:
    seen: dict[str, int] = {}
    files: dict[str, int] = {}
    for index, spec in enumerate(tokens):
        if spec.name in seen:
            raise ConfigError(
                f"{source}: $.tokens[{index}].name: {spec.name!r} is already the name of "
                f"$.tokens[{seen[spec.name]}]",
                code="duplicate_token",
            )
        if spec.file in files:
            raise ConfigError(
                f"{source}: $.tokens[{index}].file: {spec.file!r} is already the file of "
                f"$.tokens[{files[spec.file]}] (each token has its own file)",
                code="duplicate_token",
            )
        seen[spec.name] = index
        files[spec.file] = index


#: Settings that joined later: they join the digest only when set, so configs written before
#: them keep their digest (and config generation) across the upgrade.
_DIGESTED_WHEN_SET: dict[str, Any] = {
    "metrics": MetricsSettings(),
    "tracing": TracingSettings(),
    "labels": [],
}
_HTTP_DIGESTED_WHEN_SET = {"wrong_token_limit": HttpSettings().wrong_token_limit}


def _digested(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(settings)
    for name, default in _DIGESTED_WHEN_SET.items():
        if getattr(settings, name) == default:
            del out[name]
    for name, value in _HTTP_DIGESTED_WHEN_SET.items():
        if getattr(settings.http, name) == value:
            del out["http"][name]
    return out


#: Binding fields that joined later (host labels, priorities, concurrency keys, dependencies,
#: dedup and debounce): digested only when not at their default, for the same reason.
_BINDING_DIGESTED_WHEN_SET = (
    "requires", "priority", "concurrency_key", "key_limit", "on_dependency_failure",
    "dedup_key", "dedup", "dedup_window", "debounce",
)  # fmt: skip


def _digested_bindings(bindings: dict[str, Binding]) -> dict[str, Any]:
    """The bindings as digested: the fields that joined later only when set."""
    out: dict[str, Any] = msgspec.to_builtins(bindings)
    defaults = msgspec.to_builtins(Binding(executor="x"))
    for name in bindings:
        for field in _BINDING_DIGESTED_WHEN_SET:
            if out[name].get(field, defaults.get(field)) == defaults.get(field):
                out[name].pop(field, None)
    return out


def _digested_routines(routines: list[RoutineSpec]) -> list[Any]:
    """The Routines as digested: ``then`` (a fire's group, which joined later) only when set."""
    out: list[dict[str, Any]] = msgspec.to_builtins(routines)
    for routine in out:
        if not routine.get("then"):
            routine.pop("then", None)
    return out


def _check_labels(labels: list[str], field: str, source: str) -> None:
    for index, label in enumerate(labels):
        if not _LABEL.match(label):
            raise ConfigError(
                f"{source}: {field}[{index}]: {label!r} is not a label (1 to 64 letters, digits, "
                "'_', '.', ':', '/' or '-')",
                code="invalid_label",
            )
        if label in labels[:index]:
            raise ConfigError(
                f"{source}: {field}[{index}]: {label!r} is listed twice", code="invalid_label"
            )


def plugin_configs(config: Config, plugins: Plugins) -> dict[str, object]:
    """Each ``[plugins.NAME]`` table decoded by the plugin's declared type (``ConfigError``
    naming the key path otherwise); what a daemon hands to ``Plugins.configure``."""
    decoded: dict[str, object] = {}
    for name, table in config.plugins.items():
        field = _path("$.plugins", name)
        try:
            typ = plugins.config_type(name)
        except ConduitError as exc:
            raise ConfigError(f"{config.source}: {field}: {exc.message}", code=exc.code) from exc
        if typ is None:
            raise ConfigError(
                f"{config.source}: {field}: plugin {name!r} takes no configuration (it declares "
                "no conduit_config_type); remove the table",
                code="invalid_config",
            )
        decoded[name] = _convert(table, typ, field, config.source)
    return decoded


def check_against_plugins(config: Config, plugins: Plugins) -> None:
    """Every binding names an installed executor whose pool has a limit, and, if pinned, a
    declared generation; an executor that declares its binding-config type gets it checked;
    every ``[plugins.NAME]`` table decodes with its plugin's declared type."""
    plugin_configs(config, plugins)
    installed = {info.name: info for info in plugins.executors()}
    for name, binding in config.bindings.items():
        field = _path("$.bindings", name)
        info = installed.get(binding.executor)
        if info is None:
            raise ConfigError(
                f"{config.source}: {field}.executor: executor {binding.executor!r} is not "
                f"installed (installed: {', '.join(sorted(installed)) or 'none'})",
                code="unknown_executor",
            )
        if info.pool is not None and info.pool != JOBS_POOL and info.pool not in config.pools:
            # An unconfigured pool would share the global limit silently; say so up front.
            raise ConfigError(
                f"{config.source}: {field}.executor: executor {binding.executor!r} runs in pool "
                f"{info.pool!r}, which has no limit: add [pools.{info.pool}] concurrency = N",
                code="unknown_pool",
            )
        try:
            plugins.check_binding_config(
                binding.executor, binding.generation or info.generation, binding.config
            )
        except ConduitError as exc:
            raise ConfigError(
                f"{config.source}: {field}.config: {exc.message}", code="invalid_config"
            ) from exc
        if binding.generation is not None:
            gens = (info.generation, *info.historical_generations)
            if binding.generation not in gens:
                err = UnsupportedGenerationError(
                    binding.executor, binding.generation, installed=gens
                )
                raise ConfigError(
                    f"{config.source}: {field}.generation: {err}", code=err.code
                ) from err


def check_bindings_deeply(config: Config, plugins: Plugins) -> None:
    """``conduit config check`` only, after :func:`check_against_plugins`: each binding through
    its executor's deeper check (which may start processes), with the executor's own code."""
    installed = {info.name: info for info in plugins.executors()}
    for name, binding in config.bindings.items():
        info = installed[binding.executor]
        try:
            plugins.check_binding_deeply(
                binding.executor, binding.generation or info.generation, binding.config
            )
        except ConduitError as exc:
            raise ConfigError(
                f"{config.source}: {_path('$.bindings', name)}.config: {exc.message}",
                code=exc.code,
            ) from exc


def _path(prefix: str, key: str) -> str:
    if _KEY.match(key) and len(key) <= 64:
        return f"{prefix}.{key}"
    shown = key if len(key) <= 40 else key[:40] + "…"
    return f"{prefix}[{shown!r}]"


_BOUND = re.compile(r"^Expected `(?:float|int)` [<>]=? ")
_LABEL_FIELD = re.compile(r"\.(?:labels|requires)(?:\[\d+\])?`$")


def _convert(value: Any, typ: type[T], path: str, source: str) -> T:
    try:
        return msgspec.convert(value, typ)
    except msgspec.ValidationError as exc:
        message = str(exc)
        # msgspec says "... - at `$.x`"; re-root its path at the section's own path (a function
        # replacement: a key like "\x01" in the path is not a regex escape).
        message = message.replace("`$", f"`{path}")
        if "- at `" not in message:
            message = f"{message} - at `{path}`"
        code = "invalid_number" if _BOUND.match(message) else None
        if _LABEL_FIELD.search(message):
            code = "invalid_label"
        raise ConfigError(f"{source}: {message}", code=code) from exc


def _convert_table(value: Any, typ: type[T], path: str, source: str) -> dict[str, T]:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {path}: expected a table")
    out: dict[str, T] = {}
    for key, item in value.items():
        try:
            check_name(key, _path(path, key), "name")
        except InvalidValueError as exc:
            raise ConfigError(f"{source}: {exc.message}", code=exc.code) from exc
        out[key] = _convert(item, typ, _path(path, key), source)
    return out


def _convert_list(value: Any, typ: type[T], path: str, source: str) -> list[T]:
    if not isinstance(value, list):
        raise ConfigError(f"{source}: {path}: expected an array of tables")
    return [_convert(item, typ, f"{path}[{i}]", source) for i, item in enumerate(value)]


_STORE_SCHEMES = ("sqlite", "postgresql", "postgres")


def _check_store(store: str | None, source: str) -> None:
    """Refuse a store URL no backend opens here, so it is never met later as "corrupt"."""
    if store is None:
        return
    scheme, sep, rest = store.partition("://")
    problem = None
    if "\x00" in store or not store.strip():
        problem = "is empty or contains NUL"
    elif sep and scheme not in _STORE_SCHEMES:
        problem = (
            f"has an unknown scheme {scheme!r}; use a file path, sqlite:///path or postgresql://…"
        )
    elif sep and scheme == "sqlite" and not rest.partition("?")[0].strip("/"):
        problem = "names no file"
    if problem is not None:
        shown = store if scheme == "sqlite" or not sep else f"{scheme}://…"
        raise ConfigError(
            f"{source}: $.settings.store: store URL {shown!r} {problem}", code="invalid_store_url"
        )


def _check_scopes(scopes: dict[str, Scope], source: str) -> None:
    if scopes[ROOT_SCOPE].parent is not None:
        raise ConfigError(f"{source}: $.scopes.root.parent: the root scope has no parent")
    for name, scope in scopes.items():
        if name != ROOT_SCOPE and scope.parent is None:
            scopes[name] = msgspec.structs.replace(scope, parent=ROOT_SCOPE)
    for name, scope in scopes.items():
        if scope.parent is not None and scope.parent not in scopes:
            raise ConfigError(
                f"{source}: {_path('$.scopes', name)}.parent: unknown scope {scope.parent!r}"
            )
        seen = {name}
        current = scope.parent
        while current is not None:
            if current in seen:
                raise ConfigError(
                    f"{source}: {_path('$.scopes', name)}.parent: scopes form a cycle"
                )
            seen.add(current)
            current = scopes[current].parent


def _check_bindings(bindings: dict[str, Binding], scopes: dict[str, Scope], source: str) -> None:
    for name, binding in bindings.items():
        field = _path("$.bindings", name)
        if binding.scope not in scopes:
            raise ConfigError(f"{source}: {field}.scope: unknown scope {binding.scope!r}")
        if binding.concurrency_key is not None:
            try:
                concurrency_key_fields(binding.concurrency_key, f"{field}.concurrency_key")
            except InvalidValueError as exc:
                raise ConfigError(f"{source}: {exc.message}", code=exc.code) from exc
        delays = binding.retry_delays_seconds or []
        if len(delays) > MAX_RETRY_DELAYS:
            raise ConfigError(
                f"{source}: {field}.retry_delays_seconds: at most {MAX_RETRY_DELAYS} delays"
            )
        _check_submit_keys(binding, f"{source}: {field}")


def _check_submit_keys(binding: Binding, where: str) -> None:
    """A binding's dedup or debounce key templates and spans (docs/dedup.md)."""
    if binding.dedup_key is not None and binding.debounce is not None:
        raise ConfigError(f"{where}: dedup_key and debounce exclude each other (one key a submit)")
    try:
        if binding.dedup_key is not None:
            key_template_fields(binding.dedup_key, "dedup_key")
        if binding.debounce is not None:
            spec = binding.debounce
            key_template_fields(spec.key, "debounce.key")
            quiet = duration_ms(spec.quiet, "debounce.quiet")
            if quiet <= 0:
                raise ConfigError(f"{where}.debounce.quiet: must be longer than 0")
            if spec.max_wait is not None and duration_ms(spec.max_wait) < quiet:
                raise ConfigError(f"{where}.debounce.max_wait: must be at least quiet")
    except InvalidValueError as exc:
        raise ConfigError(f"{where}.{exc}") from exc


def _check_routines(
    routines: list[RoutineSpec], bindings: dict[str, Binding], scopes: dict[str, Scope], source: str
) -> None:
    ids: set[str] = set()
    for i, routine in enumerate(routines):
        field = f"$.routines[{i}]"
        if routine.id in ids:
            raise ConfigError(f"{source}: {field}.id: routine {routine.id!r} is declared twice")
        ids.add(routine.id)
        if routine.binding not in bindings:
            raise ConfigError(f"{source}: {field}.binding: unknown binding {routine.binding!r}")
        if routine.scope is not None and routine.scope not in scopes:
            raise ConfigError(f"{source}: {field}.scope: unknown scope {routine.scope!r}")
        for n, step in enumerate(routine.then):
            if step.binding not in bindings:
                raise ConfigError(
                    f"{source}: {field}.then[{n}].binding: unknown binding {step.binding!r}"
                )
            if step.scope is not None and step.scope not in scopes:
                raise ConfigError(
                    f"{source}: {field}.then[{n}].scope: unknown scope {step.scope!r}"
                )
        try:
            check_timezone(f"{field}.timezone", routine.timezone)
        except InvalidValueError as exc:
            raise ConfigError(f"{source}: {exc.message}", code=exc.code) from exc


def _check_budgets(budgets: list[Budget], scopes: dict[str, Scope], source: str) -> None:
    names: set[str] = set()
    for i, budget in enumerate(budgets):
        field = f"$.budgets[{i}]"
        if budget.name in names:
            raise ConfigError(f"{source}: {field}.name: budget {budget.name!r} is declared twice")
        names.add(budget.name)
        if budget.scope is not None:
            if budget.per == "all":
                raise ConfigError(
                    f"{source}: {field}.scope: a per-all budget is shared by every scope and "
                    "cannot be narrowed to one"
                )
            if budget.scope not in scopes:
                raise ConfigError(f"{source}: {field}.scope: unknown scope {budget.scope!r}")
