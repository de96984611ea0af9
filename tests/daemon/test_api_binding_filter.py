"""``ApiService.list_work(binding=…)`` (``GET /v1/work?binding=``, the console's work list) on a
real SQLite store: exact keyset pages, and a bounded read per page when the binding is rare.

The store keeps no binding index, so a page scans by id; past ``BINDING_SCAN`` rows it ends early
with ``next`` at the last row read. The test lowers that bound so a rare binding crosses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from conduit_core.config import parse_config
from conduit_core.http import ApiService, SubmitRequest, WorkPage
from conduit_core.http import _service as service_module
from conduit_core.plugins import Plugins
from conduit_core.runtime import Scheduler, SchedulerOptions, SystemClock
from conduit_core.storage import open_store

CONFIG = """\
[settings]
store = "unused.db"

[bindings.common]
executor = "echo"

[bindings.rare]
executor = "echo"
"""


def _pages(service: ApiService, **query: object) -> list[WorkPage]:
    async def walk() -> list[WorkPage]:
        pages, after = [], None
        while True:
            page = await service.list_work(after=after, **query)  # type: ignore[arg-type]
            pages.append(page)
            if page.next is None:
                return pages
            after = page.next

    return anyio.run(walk)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ApiService]:
    config = parse_config(CONFIG)

    async def build() -> ApiService:
        store = await open_store(str(tmp_path / "conduit.db"))
        options = SchedulerOptions.from_config(config, config_generation=1, owner="t")
        svc = ApiService(config, Scheduler(store, SystemClock(), Plugins.load(), options))
        # Ids sort as submitted: rare Work at positions 3, 40 and 77 of 80.
        for n in range(80):
            binding = "rare" if n in (3, 40, 77) else "common"
            await svc.submit(SubmitRequest(binding=binding, id=f"w{n:03d}"))
        return svc

    svc = anyio.run(build)
    yield svc
    anyio.run(svc.store.aclose)


def test_binding_filter_pages_exactly(service: ApiService) -> None:
    pages = _pages(service, binding="rare", limit=2)
    assert [[w.id for w in p.items] for p in pages] == [["w003", "w040"], ["w077"]]
    assert all(w.binding == "rare" for p in pages for w in p.items)
    common = [w.id for p in _pages(service, binding="common", limit=30) for w in p.items]
    assert len(common) == 77
    assert common == sorted(common)
    assert _pages(service, binding="nobody") == [WorkPage(items=[], next=None)]


def test_a_rare_binding_reads_a_bounded_number_of_rows_per_page(
    service: ApiService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "BINDING_SCAN", 25)
    read: list[int] = []
    list_work = service.store.list_work

    async def counting(**kwargs: object) -> object:
        rows = await list_work(**kwargs)  # type: ignore[arg-type]
        read.append(len(rows))
        return rows

    monkeypatch.setattr(service.store, "list_work", counting)
    pages = _pages(service, binding="rare", limit=10)
    # Each page read at most 25 rows: some pages end early, empty or not, and keep a `next`.
    assert [[w.id for w in p.items] for p in pages] == [["w003"], ["w040"], [], ["w077"]]
    assert all(p.next is not None for p in pages[:-1])
    assert sum(read) == 80
    assert max(read) <= 25
    # Negative control: with the bound high enough, one page holds them all.
    monkeypatch.setattr(service_module, "BINDING_SCAN", 5000)
    assert [[w.id for w in p.items] for p in _pages(service, binding="rare", limit=10)] == [
        ["w003", "w040", "w077"]
    ]
