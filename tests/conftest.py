"""Suite-wide fixtures. Async tests use anyio's pytest plugin (``@pytest.mark.anyio``)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
