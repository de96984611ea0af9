"""Suite-wide fixtures. Async tests use anyio's pytest plugin (``@pytest.mark.anyio``)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Configs without ``data_dir`` keep their state in a per-test folder, not the user's home."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state-home")))
