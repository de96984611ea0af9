"""``conduit daemon``: start-up checks, the HTTP listeners, signals, reload and graceful stop."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import secrets
import signal
import socket
from collections.abc import Generator
from pathlib import Path

import anyio
import uvicorn

from conduit_core.config import Config, check_against_plugins, load_config, plugin_configs
from conduit_core.console import with_console
from conduit_core.daemon._host import HostLoop
from conduit_core.daemon._netfs import check_local_filesystem
from conduit_core.daemon._paths import DaemonPaths, is_postgres
from conduit_core.daemon._routines import RoutinesHost, check_routine_specs
from conduit_core.daemon._tracing import check_tracing, start_tracing
from conduit_core.daemon._wake import PgWakeChannel, Waker
from conduit_core.errors import ConduitError
from conduit_core.extension import active_switches
from conduit_core.http import (
    ApiService,
    LoginThrottle,
    MetricsEndpoint,
    create_app,
    load_tokens,
    split_listen,
    with_metrics,
)
from conduit_core.http.routes_schedules import mount_schedules
from conduit_core.plugins import Plugins
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
from conduit_core.storage import Store, open_store

__all__ = ["Daemon", "bind_tcp", "bind_unix"]

log = logging.getLogger("conduit.daemon")

#: Exit status after a second stop signal (the first one stops gracefully with status 0).
EXIT_FORCED = 1


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the daemon owns SIGTERM/SIGINT/SIGHUP."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _announce_test_switches() -> None:
    """Refuse a test-only switch no test plugin provides; say so loudly when one is obeyed."""
    switches = active_switches()
    if switches.variables:
        log.warning(
            "TEST SWITCHES ACTIVE (never in production): %s, provided by %s",
            ", ".join(f"{k}={v}" for k, v in sorted(switches.variables.items())),
            ", ".join(switches.providers),
        )


def bind_tcp(listen: str) -> socket.socket:
    host, port = split_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = " (another daemon?)" if exc.errno == errno.EADDRINUSE else ""
        raise ConduitError(
            f"cannot listen on {listen}: {exc.strerror}{hint}; set settings.http.listen",
            code="listen_failed",
        ) from exc
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        log.warning("the API listens on %s, beyond this host (the token still guards it)", listen)
    return sock


def bind_unix(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()  # a stale socket of a daemon that is gone
        else:
            raise ConduitError(
                f"the unix socket {path} is in use by another daemon", code="listen_failed"
            )
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise ConduitError(
            f"cannot listen on {path}: {exc.strerror}", code="listen_failed"
        ) from exc
    finally:
        os.umask(old)
    return sock


class Daemon:
    """One daemon process: ``await Daemon(config_path).run()`` returns after a graceful stop."""

    def __init__(self, config_path: Path, *, rescan_s: float = 1.0) -> None:
        self.config_path = config_path
        self.rescan_s = rescan_s
        self.clock = SystemClock()
        self.owner = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(2)}"
        self.host: HostLoop | None = None
        self.service: ApiService | None = None
        self.routines: RoutinesHost | None = None
        self._servers: list[_Server] = []

    def _load(self, plugins: Plugins) -> Config:
        config = load_config(self.config_path)
        check_against_plugins(config, plugins)
        check_routine_specs(config)
        check_tracing(config.settings.tracing)
        return config

    async def _scheduler(
        self, config: Config, store: Store, plugins: Plugins, paths: DaemonPaths
    ) -> Scheduler:
        generation = await store.record_config_generation(config.digest, now_ms=self.clock.now_ms())
        options = SchedulerOptions.from_config(
            config,
            config_generation=generation.generation,
            owner=self.owner,
            state_dir=str(paths.data_dir),
        )
        return Scheduler(store, self.clock, plugins, options)

    async def _take_over(self, scheduler: Scheduler, paths: DaemonPaths) -> None:
        """Recover a provably dead predecessor's attempts at once, not after their leases
        expire (docs/daemon.md, "Restart after a crash")."""
        predecessor = paths.dead_predecessor()
        if predecessor is None or predecessor == self.owner:
            return
        try:
            released = await scheduler.take_over(predecessor)
        except ConduitError as exc:  # its leases still expire: recovery is only later
            log.warning(
                "leases of the dead predecessor owner=%s not released: [%s] %s",
                predecessor, exc.code, exc.message,
            )  # fmt: skip
            return
        log.info(
            "predecessor owner=%s is dead: its %d lease(s) released for recovery",
            predecessor, released,
        )  # fmt: skip

    async def run(self) -> None:
        _announce_test_switches()
        # Executor programs declared in the file load with the plugins (a reload keeps them).
        plugins = Plugins.load(programs=load_config(self.config_path).programs())
        try:
            await self._run(plugins)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await plugins.close()

    async def _run(self, plugins: Plugins) -> None:
        config = self._load(plugins)
        plugins.configure(plugin_configs(config, plugins))
        paths = DaemonPaths.from_config(config)
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
        async with contextlib.AsyncExitStack() as stack:
            store = await open_store(paths.store)
            stack.push_async_callback(store.aclose)
            tokens = load_tokens(config, paths.token_file)
            wrong = config.settings.http.wrong_token_limit
            throttle = LoginThrottle(limit=wrong) if wrong else None
            sockets = [bind_tcp(paths.listen)]
            if paths.unix_socket is not None:
                sockets.append(bind_unix(paths.unix_socket))
                stack.callback(_unlink, paths.unix_socket)
            for sock in sockets:
                stack.callback(sock.close)
            scheduler = await self._scheduler(config, store, plugins, paths)
            # Before this daemon's pid file replaces its predecessor's: a start that dies first
            # leaves the predecessor named for the next one.
            await self._take_over(scheduler, paths)
            paths.write_pid_file(self.owner)
            stack.callback(_unlink, paths.pid_file)
            waker = Waker()
            channel = (
                PgWakeChannel(paths.store, waker, owner=self.owner)
                if is_postgres(paths.store)
                else None
            )
            host = HostLoop(
                scheduler, rescan_s=self.rescan_s, waker=waker,
                on_wake=channel.notify if channel is not None else None,
            )  # fmt: skip
            self.host = host
            self.service = ApiService(config, scheduler, host)
            self.routines = RoutinesHost(store, scheduler, self.clock, host, config)
            routines = self.routines
            app = create_app(self.service, tokens, throttle=throttle)
            app = mount_schedules(app, lambda: routines.schedules, tokens)
            service = self.service
            metrics = MetricsEndpoint(
                lambda: service, tokens, open_access=config.settings.metrics.open,
                throttle=throttle,
            )  # fmt: skip
            stop_tracing = start_tracing(config.settings.tracing)
            if stop_tracing is not None:
                stack.callback(stop_tracing)  # flushes the spans still batched
            # The web console shares the listener under /ui/ (its own session login); /metrics
            # is answered before both (its own token check, or open).
            served = with_console(
                app, self.service, lambda: routines.schedules, tokens, throttle=throttle
            )
            served = with_metrics(served, metrics)
            await self._serve(host, sockets, channel, served, plugins, store, paths)
        log.info("daemon stopped owner=%s", self.owner)

    async def _serve(
        self,
        host: HostLoop,
        sockets: list[socket.socket],
        channel: PgWakeChannel | None,
        app: object,
        plugins: Plugins,
        store: Store,
        paths: DaemonPaths,
    ) -> None:
        host_done = anyio.Event()

        async def run_host(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            try:
                await host.run(task_status=task_status)
            finally:
                host_done.set()

        servers_done = anyio.Event()
        live_servers = len(sockets)

        async def serve(server: _Server, sock: socket.socket) -> None:
            nonlocal live_servers
            try:
                await server.serve([sock])
            finally:
                live_servers -= 1
                if live_servers == 0:
                    servers_done.set()

        async with anyio.create_task_group() as tg:
            if channel is not None:
                await tg.start(channel.run)
            await tg.start(run_host)
            if self.routines is not None:
                await tg.start(self.routines.run)
            for sock in sockets:
                server = _Server(
                    uvicorn.Config(
                        app,  # type: ignore[arg-type]
                        log_config=None, access_log=False, lifespan="off",
                        timeout_graceful_shutdown=2,
                    )
                )  # fmt: skip
                self._servers.append(server)
                tg.start_soon(serve, server, sock)
            tg.start_soon(self._signals, host, plugins, store, paths)
            where = [paths.listen] + ([str(paths.unix_socket)] if paths.unix_socket else [])
            log.info(
                "daemon ready owner=%s store=%s config_generation=%s listen=%s",
                self.owner, store.url, host.scheduler.options.config_generation, ",".join(where),
                extra={"owner": self.owner},
            )  # fmt: skip
            log.info("console: %s (log in with the token in %s)",
                     console_url(sockets[0]), paths.token_file)  # fmt: skip
            await host_done.wait()
            for server in self._servers:
                server.should_exit = True
            with anyio.move_on_after(3):
                await servers_done.wait()
            tg.cancel_scope.cancel()

    async def _signals(
        self, host: HostLoop, plugins: Plugins, store: Store, paths: DaemonPaths
    ) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    await self.reload(plugins, store, paths)
                    continue
                name = signal.Signals(signum).name
                if host.stopping:
                    log.warning("second %s: exiting at once", name)
                    logging.shutdown()
                    os._exit(EXIT_FORCED)
                log.info(
                    "%s: stopping (no new claims; %d running attempt(s) will be handed over)",
                    name, host.running_count(),
                )  # fmt: skip
                host.stop()

    async def reload(self, plugins: Plugins, store: Store, paths: DaemonPaths) -> None:
        """A new config generation for new attempts; live attempts keep their pinned snapshot."""
        assert self.host is not None
        assert self.service is not None
        try:
            config = self._load(plugins)
            new_paths = DaemonPaths.from_config(config)
            # Plugins take their new [plugins.*] tables first: a plugin refusing its table
            # refuses the whole reload, before any new config generation is recorded.
            plugins.configure(plugin_configs(config, plugins))
            scheduler = await self._scheduler(config, store, plugins, paths)
        except ConduitError as exc:
            log.error("reload refused, the running config stays: [%s] %s", exc.code, exc.message)
            return
        except Exception as exc:  # a reload never takes a running daemon down
            log.error("reload refused, the running config stays: %s: %s", type(exc).__name__, exc)
            return
        if (new_paths.store, new_paths.listen, new_paths.unix_socket, new_paths.token_file) != (
            paths.store,
            paths.listen,
            paths.unix_socket,
            paths.token_file,
        ) or config.tokens != self.service.config.tokens:
            log.warning("store and http settings ([[tokens]] too) change only when the daemon "
                        "restarts")  # fmt: skip
        await self.host.replace_scheduler(scheduler)
        self.service.config = config
        self.service.scheduler = scheduler
        if self.routines is not None:
            try:
                await self.routines.reload(config, scheduler)
            except Exception as exc:  # the ledger follows on the next reload or restart
                log.error("reload: routines not reconciled: %s: %s", type(exc).__name__, exc)
        log.info("config reloaded config_generation=%s", scheduler.options.config_generation)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def console_url(sock: socket.socket) -> str:
    """The web console's address on the TCP listener (``localhost`` for a wildcard address)."""
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "localhost"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/ui/"
