"""The daemon's token file appears whole: a client that reads it as soon as it exists (the demo,
a script waiting for the daemon, ``bench_daemon.launch_daemon``) never finds it empty, and two
daemons creating it at once serve one token. Before, the file was created empty and then
written, and a reader in between got ``token_unreadable`` ("empty; delete it and restart") or
sent an empty token until the wrong-token throttle shut it out for 30 s."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import secrets
import stat
from pathlib import Path

import pytest

from conduit_core.http._token import ensure_token, read_token


def test_a_reader_while_the_token_is_made_finds_no_file_or_the_whole_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "data" / "token"
    seen: list[bool] = []
    make = secrets.token_urlsafe

    def made_while_a_client_reads(nbytes: int) -> str:
        # The moment the daemon makes its token is when a client polling for the file reads it.
        seen.append(path.exists())
        if path.exists():
            read_token(path)  # an empty file raises token_unreadable
        return make(nbytes)

    monkeypatch.setattr(secrets, "token_urlsafe", made_while_a_client_reads)
    token = ensure_token(path)
    assert seen == [False]
    assert read_token(path) == token
    assert len(token) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["token"]  # no partial file left
    assert ensure_token(path) == token  # the next start reads it


def _make_tokens(folder: str, count: int, start: multiprocessing.synchronize.Event) -> list[str]:
    start.wait(30)
    return [ensure_token(Path(folder) / f"d{i}" / "token") for i in range(count)]


def _racer(folder: str, count: int, start: multiprocessing.synchronize.Event, out: object) -> None:
    out.put(_make_tokens(folder, count, start))  # type: ignore[attr-defined]


def test_two_daemons_creating_the_token_at_once_serve_the_same_one(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, out, count = ctx.Event(), ctx.Queue(), 200
    procs = [ctx.Process(target=_racer, args=(str(tmp_path), count, start, out)) for _ in range(2)]
    for proc in procs:
        proc.start()
    start.set()
    first, second = out.get(timeout=60), out.get(timeout=60)
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    assert first == second
    for i, token in enumerate(first):
        assert read_token(tmp_path / f"d{i}" / "token") == token
    assert not list(tmp_path.glob("d*/.token.*"))  # every partial file removed
