"""``conduit_core.client`` is cheap to import, and finds (or refuses to guess) the daemon."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conduit_core.client import AsyncClient, Client, ConduitClientError


def test_importing_the_client_loads_no_daemon_runtime_store_or_http_app() -> None:
    code = (
        "import sys, conduit_core.client\n"
        "heavy = ('conduit_core.daemon', 'conduit_core.runtime', 'conduit_core.storage',\n"
        "         'conduit_core.http', 'conduit_core.config', 'conduit_core.plugins',\n"
        "         'starlette', 'uvicorn', 'click', 'psycopg')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {h.split('.')[0] for h in heavy}\n"
        "             and any(m == h or m.startswith(h + '.') for h in heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("http://127.0.0.1:9999", "http://127.0.0.1:9999"),
        ("localhost:8765", "http://localhost:8765"),
        ("http://[::1]:8765/", "http://::1:8765"),
        ("unix:/run/conduit.sock", "unix:/run/conduit.sock"),
    ],
)
def test_a_url_names_tcp_or_a_unix_socket(url: str, where: str) -> None:
    assert Client(url, token="t").address.where == where
    assert AsyncClient(url, token="t").address.where == where


@pytest.mark.parametrize("url", ["https://example.com", "ftp://x:1", "unix:", "http://h:99999"])
def test_a_url_the_daemon_cannot_serve_is_refused(url: str) -> None:
    with pytest.raises(ConduitClientError) as refused:
        Client(url, token="t")
    assert refused.value.code == "client_config"
    assert url in refused.value.message


def test_without_address_token_or_config_the_client_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./conduit.toml
    for name in ("CONDUIT_URL", "CONDUIT_TOKEN", "CONDUIT_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConduitClientError) as nothing:
        Client()
    assert nothing.value.code == "client_config"
    assert "no daemon address and token" in nothing.value.message
    monkeypatch.setenv("CONDUIT_URL", "http://127.0.0.1:1")
    with pytest.raises(ConduitClientError) as no_token:
        Client()
    assert "no daemon token" in no_token.value.message
    with pytest.raises(ConduitClientError) as absent:
        Client(config=tmp_path / "absent.toml")
    assert absent.value.code == "client_config"
    assert "absent.toml: no such config file" in absent.value.message


def test_a_config_without_a_started_daemon_has_no_token_yet(tmp_path: Path) -> None:
    config = tmp_path / "conduit.toml"
    config.write_text(f'[settings]\ndata_dir = "{tmp_path / "data"}"\nhttp.listen = "127.0.0.1:9"\n')
    with pytest.raises(ConduitClientError) as refused:
        Client(config=config)
    assert refused.value.code == "token_missing"
    client = Client(config=config, token="given")  # the address still comes from the config
    assert client.address.where == "http://127.0.0.1:9"


def test_no_daemon_listening_is_daemon_unreachable(tmp_path: Path) -> None:
    client = Client(f"unix:{tmp_path / 'none.sock'}", token="t")
    with pytest.raises(ConduitClientError) as unreachable:
        client.get("w-1")
    assert unreachable.value.code == "daemon_unreachable"
    assert "none.sock" in unreachable.value.message
