"""Network is off by default: the job cannot reach the host's services."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from conduit_core.extension import OutcomeKind
from conduit_executors_container import ContainerExecutor

from .conftest import TEST_IMAGE
from .engine_checks import artifact_text
from .harness import RecordingCallbacks, make_context

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

# Prints the interfaces, then tries each "host port" argument and says what happened.
PROBE = (
    'echo "interfaces: $(ls /sys/class/net | tr "\\n" " ")"; '
    "while [ $# -gt 0 ]; do "
    '  if echo ping | nc -w 2 "$1" "$2" >/dev/null 2>&1; then echo "reached $1"; '
    '  else echo "unreachable $1"; fi; shift 2; '
    "done"
)


class _Listener:
    """A TCP server on every host address that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("0.0.0.0", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[_Listener]:
    server = _Listener()
    yield server
    server.close()


def _bridge_gateway(api: docker.APIClient) -> str | None:
    try:
        configs = api.inspect_network("bridge")["IPAM"]["Config"] or []
    except docker.errors.NotFound:
        return None
    for config in configs:
        if config.get("Gateway"):
            return str(config["Gateway"])
        if config.get("Subnet"):
            # Some engines (Debian's docker.io) report only the subnet; the bridge's address is
            # then the subnet's first host, which is where Docker puts it.
            network = ipaddress.ip_network(config["Subnet"], strict=False)
            if network.version == 4:
                return str(next(network.hosts()))
    return None


async def _probe(
    executor: ContainerExecutor,
    execution_id: str,
    state_dir: Path,
    targets: list[str],
    **config: object,
) -> str:
    ctx = make_context(
        execution_id=execution_id,
        config={
            "image": TEST_IMAGE,
            "command": ["/bin/sh", "-c", PROBE, "probe", *targets],
            **config,
        },
        callbacks=RecordingCallbacks(),
        state_dir=state_dir,
    )
    result = await (await executor.run(ctx)).wait()
    assert result.outcome is OutcomeKind.COMPLETED
    return artifact_text(result, "stdout")


async def test_network_is_off_by_default(
    executor: ContainerExecutor,
    execution_id: str,
    state_dir: Path,
    docker_api: docker.APIClient,
    listener: _Listener,
) -> None:
    port = str(listener.port)
    targets = ["127.0.0.1", port]
    gateway = _bridge_gateway(docker_api)
    if gateway is not None:
        targets += [gateway, port]
    output = await _probe(executor, execution_id, state_dir, targets)
    assert output.splitlines()[0] == "interfaces: lo "
    assert "reached" not in output.replace("unreachable", "")
    assert listener.accepted == 0


async def test_negative_control_a_bridged_job_reaches_the_host(
    executor: ContainerExecutor,
    execution_id: str,
    state_dir: Path,
    docker_api: docker.APIClient,
    listener: _Listener,
) -> None:
    gateway = _bridge_gateway(docker_api)
    if gateway is None:
        pytest.skip("the engine runs without its bridge network (--bridge=none)")
    output = await _probe(
        executor, execution_id, state_dir, [gateway, str(listener.port)], network="bridge"
    )
    assert f"reached {gateway}" in output
    assert listener.accepted == 1
