"""``conduit daemon``: start-up checks, the HTTP listeners, signals, reload and graceful stop."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
from collections.abc import Generator
from pathlib import Path

import anyio
import uvicorn
from anyio.abc import TaskGroup

from conduit_core.console import with_console
from conduit_core.daemon._host import HostLoop
from conduit_core.daemon._paths import DaemonPaths
from conduit_core.daemon._routines import RoutinesHost
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
from conduit_core.routines import ScheduleMultiplexer
from conduit_core.storage import Store

__all__ = ["Daemon", "bind_tcp", "bind_unix"]

log = logging.getLogger("conduit.daemon")

#: Exit status after a second stop signal (the first one stops gracefully with status 0).
EXIT_FORCED = 1


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the daemon owns SIGTERM/SIGINT/SIGHUP/SIGUSR1."""

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
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto
    # says TCP. Without it a kept-alive connection's every answer after the first waited ~40 ms
    # (Nagle holding the body until the client's delayed ACK of the headers).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited on accept (Linux)
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
    """One daemon process: ``await Daemon(config_path).run()`` returns after a graceful stop.

    The scheduler is :mod:`conduit_core.embed`'s, assembled as any embedding process's; the
    daemon adds the HTTP listeners (API, console, metrics) and the signals.
    """

    def __init__(self, config_path: Path, *, rescan_s: float = 1.0) -> None:
        from conduit_core.embed import EmbeddedScheduler

        self.config_path = config_path
        self.embedded = EmbeddedScheduler(config_path, rescan_s=rescan_s)
        self.embedded.serves_http = True
        self.owner = self.embedded.owner
        self._servers: list[_Server] = []

    @property
    def host(self) -> HostLoop | None:
        return self.embedded.host

    @property
    def service(self) -> ApiService | None:
        return self.embedded.service

    @property
    def routines(self) -> RoutinesHost | None:
        return self.embedded.routines

    async def run(self) -> None:
        _announce_test_switches()
        embedded = self.embedded
        async with contextlib.AsyncExitStack() as stack:
            await embedded.open(stack)
            assert embedded.paths is not None
            assert embedded.store is not None
            paths, store = embedded.paths, embedded.store
            config = embedded.config
            tokens = load_tokens(config, paths.token_file)
            wrong = config.settings.http.wrong_token_limit
            throttle = LoginThrottle(limit=wrong) if wrong else None
            sockets = [bind_tcp(paths.listen)]
            if paths.unix_socket is not None:
                sockets.append(bind_unix(paths.unix_socket))
                stack.callback(_unlink, paths.unix_socket)
            for sock in sockets:
                stack.callback(sock.close)
            async with anyio.create_task_group() as tg:
                await embedded.start(stack, tg)
                assert embedded.service is not None
                assert embedded.host is not None
                service = embedded.service
                app = create_app(service, tokens, throttle=throttle)
                app = mount_schedules(app, self._schedules, tokens)
                metrics = MetricsEndpoint(
                    lambda: service, tokens, open_access=config.settings.metrics.open,
                    throttle=throttle,
                )  # fmt: skip
                # The web console shares the listener under /ui/ (its own session login);
                # /metrics is answered before both (its own token check, or open).
                served = with_console(app, service, self._schedules, tokens, throttle=throttle)
                served = with_metrics(served, metrics)
                await self._serve(tg, embedded.host, sockets, served, store, paths)
        log.info("daemon stopped owner=%s", self.owner)

    def _schedules(self) -> ScheduleMultiplexer:
        assert self.embedded.routines is not None
        return self.embedded.routines.schedules

    async def _serve(
        self,
        tg: TaskGroup,
        host: HostLoop,
        sockets: list[socket.socket],
        app: object,
        store: Store,
        paths: DaemonPaths,
    ) -> None:
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
        tg.start_soon(self._signals, host)
        where = [paths.listen] + ([str(paths.unix_socket)] if paths.unix_socket else [])
        log.info(
            "daemon ready owner=%s store=%s config_generation=%s listen=%s",
            self.owner, store.url, host.scheduler.options.config_generation, ",".join(where),
            extra={"owner": self.owner},
        )  # fmt: skip
        log.info("console: %s (log in with the token in %s)",
                 console_url(sockets[0]), paths.token_file)  # fmt: skip
        await self.embedded.host_done.wait()
        for server in self._servers:
            server.should_exit = True
        with anyio.move_on_after(3):
            await servers_done.wait()
        tg.cancel_scope.cancel()

    async def _signals(self, host: HostLoop) -> None:
        watched = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
        with anyio.open_signal_receiver(*watched) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    await self.reload()
                    continue
                if signum == signal.SIGUSR1:
                    log.info("SIGUSR1: draining")
                    host.drain()
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

    async def reload(self, *_: object) -> None:
        """A new config generation for new attempts; live attempts keep their pinned snapshot."""
        embedded = self.embedded
        paths = embedded.paths
        assert paths is not None
        before = embedded.config
        try:
            scheduler = await embedded.reload()
        except ConduitError as exc:
            log.error("reload refused, the running config stays: [%s] %s", exc.code, exc.message)
            return
        except Exception as exc:  # a reload never takes a running daemon down
            log.error("reload refused, the running config stays: %s: %s", type(exc).__name__, exc)
            return
        new_paths = DaemonPaths.from_config(embedded.config)
        if (new_paths.store, new_paths.listen, new_paths.unix_socket, new_paths.token_file) != (
            paths.store,
            paths.listen,
            paths.unix_socket,
            paths.token_file,
        ) or embedded.config.tokens != before.tokens:
            log.warning("store and http settings ([[tokens]] too) change only when the daemon "
                        "restarts")  # fmt: skip
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
