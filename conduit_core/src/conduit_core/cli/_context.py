"""How a CLI command reaches conduit: the running daemon's API, or the store directly.

With a daemon running for the config (its pid file names a live process) every command goes
through the HTTP API with the token file. Without one, commands act on the store directly (the
same :class:`ApiService` the daemon serves); a daemon sharing a SQLite file picks direct writes
up on its next rescan, daemons on PostgreSQL are woken with NOTIFY.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import click

from conduit_core.errors import ConduitError, ConfigError

if TYPE_CHECKING:  # the CLI imports the heavy layers in the commands that use them
    from conduit_core.config import Config
    from conduit_core.daemon import DaemonPaths
    from conduit_core.http import (
        BatchSubmitRequest,
        BatchSubmitResult,
        BulkRequest,
        BulkResult,
        CancelRequest,
        CapacityView,
        ConfirmStoppedRequest,
        DaemonList,
        DrainView,
        EventView,
        Health,
        HistoryPage,
        InputRequest,
        InterruptRequest,
        OutputTail,
        RetryRequest,
        SubmitRequest,
        WorkDetail,
        WorkFilter,
        WorkPage,
    )

__all__ = [
    "CONFIG_ENV",
    "Api",
    "call",
    "config_option",
    "json_option",
    "load",
    "no_daemon_note",
    "open_api",
    "print_json",
    "run",
]

T = TypeVar("T")
CONFIG_ENV = "CONDUIT_CONFIG"


class Api(Protocol):
    """What both :class:`ApiClient` and :class:`ApiService` offer."""

    async def submit(self, req: SubmitRequest) -> WorkDetail: ...
    async def submit_batch(self, req: BatchSubmitRequest) -> BatchSubmitResult: ...
    async def list_work(
        self, filters: WorkFilter | None = None, *, limit: int = 100, after: str | None = None
    ) -> WorkPage: ...
    async def bulk(self, action: str, req: BulkRequest) -> BulkResult: ...
    async def show(self, work_id: str) -> WorkDetail: ...
    async def send_input(self, work_id: str, req: InputRequest) -> EventView: ...
    async def inject(self, work_id: str, req: InputRequest) -> EventView: ...
    async def cancel(self, work_id: str, req: CancelRequest) -> WorkDetail: ...
    async def retry(self, work_id: str, req: RetryRequest) -> WorkDetail: ...
    async def confirm_stopped(self, work_id: str, req: ConfirmStoppedRequest) -> WorkDetail: ...
    async def interrupt(self, work_id: str, req: InterruptRequest) -> WorkDetail: ...
    async def history(
        self, work_id: str, *, limit: int = 100, after: str | None = None, newest: bool = False
    ) -> HistoryPage: ...
    async def output(self, work_id: str, attempt: int, stream: str, tail: int) -> OutputTail: ...
    async def capacity(self) -> CapacityView: ...
    async def health(self) -> Health: ...
    async def daemons(self) -> DaemonList: ...
    async def drain(self) -> DrainView: ...


def config_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--config",
        "config_path",
        type=click.Path(path_type=Path),
        default=None,
        help=f"conduit.toml (default: ${CONFIG_ENV}, else ./conduit.toml).",
    )(func)


def json_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(func)


def load(config_path: Path | None) -> tuple[Config, DaemonPaths]:
    from conduit_core.config import load_config
    from conduit_core.daemon import DaemonPaths

    path = config_path or Path(os.environ.get(CONFIG_ENV, "conduit.toml"))
    if not path.exists():
        how = "from --config" if config_path else (
            f"from ${CONFIG_ENV}" if CONFIG_ENV in os.environ else "the default, ./conduit.toml"
        )  # fmt: skip
        raise ConfigError(
            f"{path}: no such config file ({how}); point at one with --config PATH or "
            f"{CONFIG_ENV}=PATH (examples/conduit.toml is a start)"
        )
    config = load_config(path)
    return config, DaemonPaths.from_config(config)


def no_daemon_note(config_path: Path | None) -> str | None:
    """What to tell a person whose Work will not move because no daemon runs for the config."""
    _, paths = load(config_path)
    if paths.running_pid() is not None:
        return None
    flag = f" --config {config_path}" if config_path else ""
    return (
        f"note: no daemon is running for this config (data dir {paths.data_dir}), so nothing "
        f"starts the Work yet; start one with: conduit daemon{flag}"
    )


def _daemon_api(paths: DaemonPaths) -> Api | None:
    """The running daemon's API client, or ``None`` when no daemon runs for the config (or
    the process running it embeds the scheduler without serving HTTP)."""
    if paths.running_pid() is None or not paths.pidfile.serves_http():
        return None
    from conduit_core.http._client import ApiClient
    from conduit_core.http._token import read_token

    token = read_token(paths.token_file)
    unix = str(paths.unix_socket) if paths.unix_socket else None
    return ApiClient(token, listen=paths.listen, unix_socket=unix)


def call(config_path: Path | None, go: Callable[[Api], Coroutine[Any, Any, T]]) -> T:
    """``go(api)``: against a running daemon without an event loop (the API client's calls
    block, its coroutines never suspend: no asyncio nor anyio to import, a read answers in
    milliseconds), else on the store directly as :func:`open_api` gives it."""
    _, paths = load(config_path)
    client = _daemon_api(paths)
    if client is not None:
        coro = go(client)
        try:
            coro.send(None)
        except StopIteration as done:
            result: T = done.value
            return result
        coro.close()
        raise RuntimeError("a call to the daemon's API suspended: run it with run()")

    async def direct() -> T:
        async with open_api(config_path) as api:
            return await go(api)

    return run(direct)


@asynccontextmanager
async def open_api(config_path: Path | None) -> AsyncIterator[Api]:
    """The daemon's API when one runs for this config, else the store directly."""
    config, paths = load(config_path)
    client = _daemon_api(paths)
    if client is not None:
        yield client
        return
    import anyio.to_thread

    from conduit_core.daemon import is_postgres, notify_sync
    from conduit_core.http import ApiService
    from conduit_core.plugins import Plugins
    from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
    from conduit_core.storage import open_store

    plugins = Plugins.load(programs=config.programs())
    async with await open_store(paths.store) as store:
        latest = await store.latest_config_generation()
        options = SchedulerOptions.from_config(
            config,
            config_generation=latest.generation if latest else 1,
            owner=f"cli/{os.getpid()}",
            state_dir=str(paths.data_dir),
        )
        service = ApiService(config, Scheduler(store, SystemClock(), plugins, options))
        yield service
        if is_postgres(paths.store):
            try:
                await anyio.to_thread.run_sync(notify_sync, paths.store)
            except Exception as exc:  # the daemons' rescan finds the write anyway
                click.echo(f"note: could not wake the daemons ({type(exc).__name__})", err=True)


def run(func: Callable[[], Coroutine[Any, Any, T]]) -> T:
    import anyio

    return anyio.run(func)


def print_json(value: Any) -> None:
    import msgspec

    click.echo(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())


def parse_json_option(text: str | None, what: str) -> Any:
    if text is None:
        return None
    import msgspec

    from conduit_core.validation import MAX_PAYLOAD_BYTES, decode_bounded

    try:
        # click hands undecodable argv bytes over as lone surrogates.
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConduitError(f"{what} is not valid UTF-8", code="invalid_json") from None
    try:
        return decode_bounded(msgspec.json.decode, raw, field=what, max_bytes=MAX_PAYLOAD_BYTES)
    except msgspec.DecodeError as exc:
        raise ConduitError(f"{what} is not valid JSON: {exc}", code="invalid_json") from exc
