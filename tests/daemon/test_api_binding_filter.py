"""``ApiService.list_work`` (``GET /v1/work``, the console's work list) on a real SQLite store:
exact keyset pages by binding (an index: ``conduit_work_binding_created``), and a bounded read
per page when an input-key search matches rarely.

The input key has no index: a page reads rows in page order, at most ``INPUT_SCAN``, and past
that ends early with ``next`` (and ``partial``). The test lowers that bound so a rare value
crosses it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from conduit_core.config import parse_config
from conduit_core.http import ApiService, SubmitRequest, WorkFilter, WorkPage
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


def _pages(service: ApiService, *, limit: int, **query: str) -> list[WorkPage]:
    async def walk() -> list[WorkPage]:
        pages, after = [], None
        while True:
            page = await service.list_work(WorkFilter(**query), limit=limit, after=after)
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
            customer = "rare" if n in (3, 40, 77) else "common"
            await svc.submit(SubmitRequest(binding=binding, id=f"w{n:03d}",
                                           input={"customer": customer}))  # fmt: skip
        return svc

    svc = anyio.run(build)
    yield svc
    anyio.run(svc.store.aclose)


def test_binding_filter_pages_exactly(service: ApiService) -> None:
    pages = _pages(service, binding="rare", limit=2, order="oldest")
    assert [[w.id for w in p.items] for p in pages] == [["w003", "w040"], ["w077"]]
    assert all(w.binding == "rare" for p in pages for w in p.items)
    common = [w.id for p in _pages(service, binding="common", limit=30) for w in p.items]
    assert len(common) == 77
    assert common == sorted(common, reverse=True)  # newest first (submitted in id order)
    assert [p.items for p in _pages(service, binding="nobody", limit=10)] == [[]]


def test_a_rare_input_value_reads_a_bounded_number_of_rows_per_page(
    service: ApiService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "INPUT_SCAN", 25)
    pages = _pages(service, limit=10, order="oldest", input="customer=rare")
    # Each page read at most 25 rows: some end early, empty or not, with a `next` and `partial`.
    assert [[w.id for w in p.items] for p in pages] == [["w003"], ["w040"], [], ["w077"]]
    assert all(p.next is not None and p.partial for p in pages[:-1])
    assert pages[-1].next is None
    # Negative control: with the bound high enough, one page holds them all.
    monkeypatch.setattr(service_module, "INPUT_SCAN", 5000)
    pages = _pages(service, limit=10, order="oldest", input="customer=rare")
    assert [[w.id for w in p.items] for p in pages] == [["w003", "w040", "w077"]]
