"""``conduit doctor``: each check prints ok / warn / fail with the fix; any fail exits 1."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from conduit_core.cli._context import config_option, json_option, load, print_json
from conduit_core.errors import ConduitError

if TYPE_CHECKING:
    from conduit_core.config import Config
    from conduit_core.daemon import DaemonPaths
    from conduit_core.plugins import Plugins
    from conduit_core.storage import Store

__all__ = ["doctor_command"]

Level = Literal["ok", "warn", "fail"]
_STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}


@dataclass
class Check:
    name: str
    status: Level
    message: str
    fix: str = ""


@click.command("doctor")
@config_option
@json_option
def doctor_command(config_path: Path | None, as_json: bool) -> None:
    """Check the store, the plugins, pinned generations, capacity, holds and the Docker engine."""
    import anyio
    from rich.text import Text

    from conduit_core.cli._render import console

    checks = anyio.run(_run_checks, config_path)
    if as_json:
        print_json([asdict(c) for c in checks])
    else:
        out = console()
        for check in checks:
            out.print(
                Text.assemble(
                    (f"{check.status:<4}", _STYLE[check.status]), f" {check.name}: {check.message}"
                )
            )
            if check.fix and check.status != "ok":
                out.print(f"     fix: {check.fix}", style="dim")
    if any(c.status == "fail" for c in checks):
        click.get_current_context().exit(1)


async def _run_checks(config_path: Path | None) -> list[Check]:
    from conduit_core.config import check_against_plugins
    from conduit_core.daemon import check_local_filesystem
    from conduit_core.plugins import Plugins
    from conduit_core.storage import SCHEMA_VERSION, open_store

    checks: list[Check] = []
    try:
        config, paths = load(config_path)
    except ConduitError as exc:
        return [Check("config", "fail", exc.message, "fix the file, see docs/configuration.md")]
    checks.append(Check("config", "ok", f"{config.source} ({len(config.bindings)} binding(s))"))
    plugins: Plugins | None = None
    try:
        plugins = Plugins.load(programs=config.programs())
        check_against_plugins(config, plugins)
        names = ", ".join(sorted(i.name for i in plugins.executors())) or "none"
        checks.append(Check("plugins", "ok", f"manifests valid; executors: {names}"))
    except ConduitError as exc:
        checks.append(Check(
            "plugins", "fail", f"[{exc.code}] {exc.message}",
            "reinstall or block the named package (CONDUIT_DISABLED_PLUGINS=name)",
        ))  # fmt: skip
    if plugins is not None:
        checks.extend(await _program_checks(plugins))
    checks.append(_token_check(config, paths))
    pid = paths.running_pid()
    checks.append(
        Check("daemon", "ok", f"running (pid {pid})")
        if pid is not None
        else Check("daemon", "warn", "no daemon runs for this config", "start `conduit daemon`")
    )
    switches = _switch_check()
    checks.append(switches)
    if switches.status == "fail":
        return checks  # the store refuses to open with it too
    if pid is not None:
        checks.extend(await _daemon_program_checks(paths))
    if paths.sqlite_file is not None:
        try:
            check_local_filesystem(paths.sqlite_file)
        except ConduitError as exc:
            checks.append(Check("store filesystem", "fail", exc.message, "move the store"))
            return checks
    try:
        store = await open_store(paths.store)
    except ConduitError as exc:
        fix = (
            "upgrade conduit" if exc.code == "store_schema_newer"
            else "check settings.store and that the database is up"
        )  # fmt: skip
        checks.append(Check("store", "fail", f"[{exc.code}] {exc.message}", fix))
        return checks
    async with store:
        checks.append(Check("store", "ok", f"{store.url} reachable, schema {SCHEMA_VERSION}"))
        if plugins is not None:
            checks.extend(await _store_checks(store, config, plugins))
    checks.extend(await _docker_check(config))
    return checks


def _token_check(config: Config, paths: DaemonPaths) -> Check:
    """The API tokens' files: readable, private (mode 0600), not empty, each its own secret."""
    from conduit_core.http import token_files, token_problems

    problems = token_problems(config, paths.token_file)
    if problems:
        text = "; ".join(f"[{p.code}] {p.message}" for p in problems)
        return Check("tokens", "fail", text, "fix each named token file (docs/http.md, Tokens)")
    names = ", ".join(f"{p.name} ({p.role})" for p, _ in token_files(config, paths.token_file))
    return Check("tokens", "ok", names)


def _switch_check() -> Check:
    """Test-only switches: none in production; where the test plugin provides them, say which."""
    from conduit_core.extension import active_switches

    try:
        switches = active_switches()
    except ConduitError as exc:
        return Check("test switches", "fail", f"[{exc.code}] {exc.message}",
                     "unset the variable: it is for conduit's own test suite")  # fmt: skip
    if not switches.variables:
        return Check("test switches", "ok", "none set")
    active = ", ".join(f"{k}={v}" for k, v in sorted(switches.variables.items()))
    return Check(
        "test switches", "warn",
        f"active: {active} (provided by {', '.join(switches.providers)})",
        "a test-only switch removes a protection or kills the daemon on purpose: unset it",
    )  # fmt: skip


async def _store_checks(store: Store, config: Config, plugins: Plugins) -> list[Check]:
    from conduit_core.model import HoldKind

    checks: list[Check] = []
    pinned = {
        (ex.snapshot.executor, ex.snapshot.executor_generation)
        for ex in [*await store.live_executions(), *await store.unconfirmed_exclusions()]
    }
    missing: list[str] = []
    for executor, generation in sorted(pinned):
        try:
            plugins.executor(executor, generation)
        except ConduitError as exc:
            missing.append(exc.message)
    if missing:
        checks.extend(Check("pinned generations", "fail", m, "install the named generation")
                      for m in missing)  # fmt: skip
    else:
        checks.append(Check("pinned generations", "ok", f"{len(pinned)} in use, all installed"))
    checks.extend(await _capacity_checks(store, config, plugins))
    holds = await store.list_holds()
    by_holder = Counter((h.kind, h.holder) for h in holds)
    if not holds:
        checks.append(Check("holds", "ok", "no Work is held"))
    for (kind, holder), count in sorted(by_holder.items()):
        fix = (
            f"a person decides: approve or reject through gate {holder!r}"
            if kind is HoldKind.GATE
            else f"raise budget {holder!r} or wait for its period to end"
        )
        checks.append(Check("holds", "warn", f"{count} Work held by {kind} {holder!r}", fix))
    return checks


async def _capacity_checks(store: Store, config: Config, plugins: Plugins) -> list[Check]:
    from conduit_core.runtime import JOBS_POOL

    pools = {info.name: info.pool for info in plugins.executors()}
    limits: dict[str, int] = {
        "global": config.settings.concurrency,
        JOBS_POOL: config.settings.job_concurrency,
    }
    in_use: Counter[str] = Counter()
    for ex in {e.id: e for e in [*await store.live_executions(),
                                 *await store.unconfirmed_exclusions()]}.values():  # fmt: skip
        in_use[ex.snapshot.pool or "global"] += 1
    waiting: Counter[str] = Counter()
    for work in await store.ready_work(limit=1000):
        binding = config.bindings.get(work.binding)
        pool = pools.get(binding.executor) if binding is not None else None
        waiting[pool or "global"] += 1
    checks: list[Check] = []
    for pool, limit in sorted(limits.items()):
        text = f"pool {pool}: {in_use[pool]}/{limit} in use, {waiting[pool]} ready Work"
        setting = "job_concurrency" if pool == JOBS_POOL else "concurrency"
        if waiting[pool] and in_use[pool] >= limit:
            checks.append(Check("capacity", "warn", f"{text} waiting for a slot",
                                f"raise settings.{setting}, or wait"))  # fmt: skip
        else:
            checks.append(Check("capacity", "ok", text))
    return checks


async def _daemon_program_checks(paths: DaemonPaths) -> list[Check]:
    """The running daemon's own executor programs, from its /v1/health: the restarts, failed
    starts and protocol errors its log reports (``doctor``'s fresh start cannot see them)."""
    import anyio.to_thread

    from conduit_core.http import ApiClient, Health, read_token

    def ask() -> Health:
        unix = str(paths.unix_socket) if paths.unix_socket else None
        client = ApiClient(read_token(paths.token_file), listen=paths.listen, unix_socket=unix)
        return client.request("GET", "/v1/health", None, Health)

    try:
        health = await anyio.to_thread.run_sync(ask)
    except Exception as exc:
        return [Check("executor programs in the daemon", "warn",
                      f"could not ask the daemon ({type(exc).__name__}: {exc})",
                      "check the daemon's HTTP settings and token file")]  # fmt: skip
    checks: list[Check] = []
    for program in health.programs:
        name = f"executor program {program.executor} in the daemon"
        text = (
            f"{program.status}" + (f" (pid {program.pid})" if program.pid else "")
            + f"; {program.restarts} restart(s), {program.protocol_errors} protocol error(s)"
            + (f", {program.failed_starts} failed start(s)" if program.failed_starts else "")
            + " since the daemon started"
        )  # fmt: skip
        if program.restarts or program.failed_starts or program.protocol_errors:
            checks.append(Check(
                name, "warn", f"{text}; last: {program.last_error}",
                "read the daemon's log (logger conduit.remote) and docs/wire-protocol.md",
            ))  # fmt: skip
        else:
            checks.append(Check(name, "ok", text))
    return checks


async def _program_checks(plugins: Plugins) -> list[Check]:
    """Each out-of-process executor: start its program, shake hands, shut it down again (a
    fresh start in this process; the daemon's own programs are :func:`_daemon_program_checks`)."""
    checks: list[Check] = []
    for supervisor in plugins.programs():
        name = f"executor program {supervisor.name}"
        try:
            conn = await supervisor.connection()
        except ConduitError as exc:
            fix = "fix or reinstall the program; see docs/wire-protocol.md"
            checks.append(Check(name, "fail", f"[{exc.code}] {exc.message}", fix))
            continue
        manifest = conn.manifest
        assert manifest is not None
        generations = ", ".join(map(str, (manifest.generation, *manifest.historical_generations)))
        state = supervisor.state()
        checks.append(Check(name, "ok", (
            f"{' '.join(supervisor.command)} answers the handshake (a fresh start by doctor, "
            f"pid {state['pid']}): "
            f"generation(s) {generations}, pool {manifest.pool or '-'}, capabilities "
            f"{', '.join(manifest.capabilities) or '-'}"
        )))  # fmt: skip
        await supervisor.close()
    return checks


async def _docker_check(config: Config) -> list[Check]:
    import anyio.to_thread

    if not any(b.executor == "container" for b in config.bindings.values()):
        return []

    def ping() -> None:
        import docker

        client = docker.from_env(timeout=5)
        try:
            client.ping()
        finally:
            client.close()

    try:
        await anyio.to_thread.run_sync(ping)
    except ImportError:
        return [Check("docker", "fail", "the docker SDK is not installed",
                      "pip install conduit-executors-container")]  # fmt: skip
    except Exception as exc:
        return [Check("docker", "fail", f"the Docker engine is not reachable ({exc})",
                      "start dockerd, or set DOCKER_HOST")]  # fmt: skip
    return [Check("docker", "ok", "the Docker engine answers")]
