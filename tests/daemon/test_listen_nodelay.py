"""The daemon's TCP listener hands asyncio sockets it sets TCP_NODELAY on: without it, every
answer after the first on a kept-alive connection waited ~40 ms (Nagle and delayed ACK; figures
in bench/README.md, "CLI start-up")."""

from __future__ import annotations

import asyncio
import socket

from conduit_core.daemon._run import bind_tcp


async def _accepted_nodelay(listener: socket.socket) -> int:
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(accepted, sock=listener)
    async with server:
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()


def test_connections_accepted_on_the_daemons_listener_send_without_delay() -> None:
    listener = bind_tcp("127.0.0.1:0")
    assert asyncio.run(_accepted_nodelay(listener)) != 0


def test_the_check_sees_a_listener_without_it() -> None:
    # Negative control: a plain socket (proto 0), as the daemon bound before, is left to Nagle.
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    plain.bind(("127.0.0.1", 0))
    assert asyncio.run(_accepted_nodelay(plain)) == 0
