"""The scheduler assembled and run inside a process: what ``conduit daemon`` runs, minus HTTP.

One assembly path: :class:`Assembly` loads the config and plugins, opens the store,
records the config generation, takes over a provably dead predecessor's leases, writes the pid
file and runs the host loop, the PostgreSQL wake channel and the Routines ticker. The daemon
(``conduit_core.daemon._run``) adds its listeners and signals between :meth:`open` and
:meth:`start`; an application uses ``async with embed.run(config)`` (or :class:`Embedded`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup, TaskStatus

from conduit_core.config import Config, check_against_plugins, load_config, plugin_configs
from conduit_core.daemon import (
    DaemonPaths,
    DaemonRegistry,
    HostLoop,
    KeyRelease,
    KeyUnpark,
    PgWakeChannel,
    PidFile,
    RoutinesHost,
    StatisticsUpkeep,
    Waker,
    check_local_filesystem,
    check_routine_specs,
    check_tracing,
    is_postgres,
    start_tracing,
)
from conduit_core.errors import ConduitError
from conduit_core.extension import active_switches
from conduit_core.http import ApiService
from conduit_core.plugins import Plugins
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
from conduit_core.storage import Claim, Store, open_store

__all__ = ["Assembly", "new_owner", "take_over_dead_predecessor"]

log = logging.getLogger("conduit.daemon")


def new_owner() -> str:
    """A fresh owner id for this process's leases: ``host/pid/random``."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(2)}"


async def take_over_dead_predecessor(scheduler: Scheduler, pidfile: PidFile) -> int:
    """Release the leases of the process ``pidfile`` names if it is provably dead (see
    :meth:`PidFile.dead_predecessor`), so recovery adopts its attempts at once instead of after
    their leases expire (docs/daemon.md, "Restart after a crash"). The count released; 0 with
    no proof, or when the store refuses (its leases then still expire)."""
    predecessor = pidfile.dead_predecessor()
    if predecessor is None or predecessor == scheduler.options.owner:
        return 0
    try:
        released = await scheduler.take_over(predecessor)
    except ConduitError as exc:
        log.warning(
            "leases of the dead predecessor owner=%s not released: [%s] %s",
            predecessor, exc.code, exc.message,
        )  # fmt: skip
        return 0
    log.info(
        "predecessor owner=%s is dead: its %d lease(s) released for recovery",
        predecessor, released,
    )  # fmt: skip
    return released


class Assembly:
    """The scheduler of one config, run in this process (see docs/python.md, "Embedding";
    :class:`~conduit_core.embed.EmbeddedScheduler` adds submit, get and wait).

    ``config`` is a :class:`~conduit_core.config.Config` (``parse_config``) or the path of a
    conduit.toml. Its data dir holds the pid file: one process at a time runs a data dir
    (``daemon_running`` otherwise), and the next one takes over this one's leases at once if it
    was killed. ``plugins``: the loaded plugins to use (default: every installed one, with the
    config's executor programs); they are closed on exit either way.
    """

    def __init__(
        self,
        config: Config | str | os.PathLike[str],
        *,
        owner: str | None = None,
        rescan_s: float = 1.0,
        plugins: Plugins | None = None,
        routines: bool = True,
    ) -> None:
        if isinstance(config, Config):
            self._path: Path | None = None
            self.config = config
        else:
            self._path = Path(config)
        self.rescan_s = rescan_s
        self.clock = SystemClock()
        self.owner = owner or new_owner()
        self.with_routines = routines
        #: Recorded in the pid file: the CLI asks a process that serves HTTP (the daemon sets
        #: it), else works on the store directly.
        self.serves_http = False
        self._given_plugins = plugins
        self.plugins: Plugins | None = None
        self.paths: DaemonPaths | None = None
        self.store: Store | None = None
        self.scheduler: Scheduler | None = None
        self.host: HostLoop | None = None
        self.service: ApiService | None = None
        self.routines: RoutinesHost | None = None
        self.channel: PgWakeChannel | None = None
        self.statistics: StatisticsUpkeep | None = None
        #: Set once the host loop has returned (after :meth:`stop`, or a failure).
        self.host_done = anyio.Event()
        self._ended = anyio.Event()
        self._cm: contextlib.AbstractAsyncContextManager[Self]

    # --- the two steps a host runs (the daemon binds its listeners between them) -------------

    def load_config(self, plugins: Plugins) -> Config:
        """The config (read again from its file, if it came from one), checked as at start."""
        config = load_config(self._path) if self._path is not None else self.config
        check_against_plugins(config, plugins)
        check_routine_specs(config)
        check_tracing(config.settings.tracing)
        return config

    async def open(self, stack: contextlib.AsyncExitStack) -> None:
        """Plugins, config, data dir and store; refuses a data dir another process runs."""
        active_switches()  # refuses a test-only switch no test plugin provides
        first = load_config(self._path) if self._path is not None else self.config
        plugins = self._given_plugins or Plugins.load(programs=first.programs())
        self.plugins = plugins
        stack.push_async_callback(_close_plugins, plugins)
        config = self.load_config(plugins)
        self.config = config
        plugins.configure(plugin_configs(config, plugins))
        paths = DaemonPaths.from_config(config)
        self.paths = paths
        if paths.sqlite_file is not None:
            check_local_filesystem(paths.sqlite_file)
            paths.sqlite_file.parent.mkdir(parents=True, exist_ok=True)
        paths.data_dir.mkdir(parents=True, exist_ok=True)
        other = paths.running_pid()
        if other is not None and other != os.getpid():
            raise ConduitError(
                f"a daemon (pid {other}) already runs with data dir {paths.data_dir}; stop it "
                f"first, or give this one another settings.data_dir",
                code="daemon_running",
            )
        self.store = await open_store(paths.store)
        stack.push_async_callback(self.store.aclose)

    async def start(self, stack: contextlib.AsyncExitStack, tg: TaskGroup) -> None:
        """Scheduler, takeover, pid file, then the host loop, wake channel and ticker in ``tg``."""
        assert self.store is not None
        assert self.paths is not None
        assert self.plugins is not None
        store, paths = self.store, self.paths
        scheduler = await self._scheduler(self.config)
        self.scheduler = scheduler
        # Before this process's pid file replaces its predecessor's: a start that dies first
        # leaves the predecessor named for the next one.
        await take_over_dead_predecessor(scheduler, paths.pidfile)
        paths.pidfile.write(self.owner, http=self.serves_http)
        stack.callback(paths.pidfile.remove)
        waker = Waker()
        if is_postgres(paths.store):
            self.channel = PgWakeChannel(paths.store, waker, owner=self.owner)
        channel = self.channel
        host = HostLoop(
            scheduler, rescan_s=self.rescan_s, waker=waker,
            on_wake=channel.notify if channel is not None else None,
            on_ready=channel.notify_ready if channel is not None else None,
        )  # fmt: skip
        if channel is not None:
            channel.on_ready = host.claim_soon
        host.add_attempt_listener(self._attempt_ended)
        self.host = host
        registry = DaemonRegistry(host)
        try:
            await registry.write()
        except ConduitError as exc:  # its heartbeat writes it once the store answers
            log.warning("daemon registry: start not recorded: [%s] %s", exc.code, exc.message)
        host.add_step("daemon registry", registry.heartbeat)
        host.add_step("dedup key release", KeyRelease().step)
        host.add_step("concurrency key unpark", KeyUnpark().step)
        stack.push_async_callback(registry.stopped)  # after the host loop has returned
        self.service = ApiService(self.config, scheduler, host)
        if self.with_routines:
            self.routines = RoutinesHost(store, scheduler, self.clock, host, self.config)
        stop_tracing = start_tracing(self.config.settings.tracing)
        if stop_tracing is not None:
            stack.callback(stop_tracing)  # flushes the spans still batched
        if channel is not None:
            await tg.start(channel.run)
        self.statistics = StatisticsUpkeep(store)
        await tg.start(self.statistics.run)
        await tg.start(self._run_host)
        if self.routines is not None:
            await tg.start(self.routines.run)

    async def _scheduler(self, config: Config) -> Scheduler:
        assert self.store is not None
        assert self.paths is not None
        assert self.plugins is not None
        generation = await self.store.record_config_generation(
            config.digest, now_ms=self.clock.now_ms()
        )
        options = SchedulerOptions.from_config(
            config,
            config_generation=generation.generation,
            owner=self.owner,
            state_dir=str(self.paths.data_dir),
        )
        return Scheduler(self.store, self.clock, self.plugins, options)

    async def _run_host(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        assert self.host is not None
        try:
            await self.host.run(task_status=task_status)
        finally:
            self.host_done.set()

    def _attempt_ended(self, claim: Claim) -> None:
        ended, self._ended = self._ended, anyio.Event()
        ended.set()

    async def attempt_ended(self, at_most_s: float) -> None:
        """Return when an attempt run here has ended and its outcome is written, or after
        ``at_most_s`` seconds."""
        with anyio.move_on_after(at_most_s):
            await self._ended.wait()

    # --- running it ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop gracefully: no new claims; running attempts are handed over (their leases
        released, the jobs left running, for the next owner to adopt)."""
        if self.host is not None:
            self.host.stop()

    @property
    def stopping(self) -> bool:
        return self.host is not None and self.host.stopping

    async def reload(self, config: Config | None = None) -> Scheduler:
        """A new config generation for new attempts (the file read again, or ``config``);
        live attempts keep their pinned snapshot. Raises :class:`ConduitError` and changes
        nothing when the new config is refused."""
        assert self.host is not None
        assert self.service is not None
        assert self.plugins is not None
        if config is not None:
            self._path = None
            self.config = config
        config = self.load_config(self.plugins)
        # Plugins take their new [plugins.*] tables first: a plugin refusing its table refuses
        # the whole reload, before any new config generation is recorded.
        self.plugins.configure(plugin_configs(config, self.plugins))
        scheduler = await self._scheduler(config)
        await self.host.replace_scheduler(scheduler)
        self.config = config
        self.scheduler = scheduler
        self.service.config = config
        self.service.scheduler = scheduler
        if self.routines is not None:
            try:
                await self.routines.reload(config, scheduler)
            except Exception as exc:  # the ledger follows on the next reload or restart
                log.error("reload: routines not reconciled: %s: %s", type(exc).__name__, exc)
        return scheduler

    @contextlib.asynccontextmanager
    async def _running(self) -> AsyncIterator[Self]:
        async with contextlib.AsyncExitStack() as stack:
            await self.open(stack)
            async with anyio.create_task_group() as tg:
                await self.start(stack, tg)
                try:
                    yield self
                finally:
                    self.stop()
                    with anyio.CancelScope(shield=True):
                        await self.host_done.wait()
                    tg.cancel_scope.cancel()

    async def __aenter__(self) -> Self:
        self._cm = self._running()
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self._cm.__aexit__(*exc_info)


async def _close_plugins(plugins: Plugins) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(10):
        await plugins.close()


#: A listener :meth:`HostLoop.add_attempt_listener` takes.
AttemptListener = Callable[[Claim], None]
