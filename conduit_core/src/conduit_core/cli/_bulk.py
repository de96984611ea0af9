"""``conduit work submit --from FILE.jsonl``: many Work from a JSON Lines file.

The whole file is read and checked before anything is sent, so a bad line stores nothing; then
the items go in batches of :data:`~conduit_core.http.MAX_BATCH_ITEMS` through ``submit_batch``
(one request and one store transaction each), and every refused item is named by its line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import msgspec

from conduit_core.cli._context import open_api, print_json, run
from conduit_core.errors import ConduitError
from conduit_core.http import (
    MAX_BATCH_ITEMS,
    BatchItemResult,
    BatchSubmitRequest,
    BatchSubmitResult,
    SubmitRequest,
)
from conduit_core.validation import MAX_DEPTH, TooDeepError, check_depth

__all__ = ["read_submit_lines", "submit_from_file"]

_LINE = msgspec.json.Decoder(SubmitRequest)
#: Bad lines named in the error at most (the count says how many more).
_SHOWN = 10


def read_submit_lines(path: Path) -> list[tuple[int, SubmitRequest]]:
    """Each non-blank line as ``(line number, submit body)``, or one error naming every bad
    line (``invalid_jsonl``)."""
    try:
        raw = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise ConduitError(f"--from {path}: {exc.strerror or exc}", code="unreadable_file") from exc
    items: list[tuple[int, SubmitRequest]] = []
    bad: list[str] = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = _LINE.decode(line)
            check_depth(item.input, "$.input", MAX_DEPTH)
        except (msgspec.DecodeError, TooDeepError, RecursionError) as exc:
            bad.append(f"line {number}: {exc}")
            continue
        items.append((number, item))
    if bad:
        shown = "\n  ".join(bad[:_SHOWN])
        more = f"\n  … and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else ""
        raise ConduitError(
            f"--from {path}: {len(bad)} bad line(s), nothing was submitted:\n  {shown}{more}",
            code="invalid_jsonl",
        )
    return items


def submit_from_file(path: Path, config_path: Path | None, as_json: bool) -> None:
    """Submit every line of ``path``; exit 1 when any item was refused."""
    lines = read_submit_lines(path)

    async def go() -> list[BatchSubmitResult]:
        results: list[BatchSubmitResult] = []
        async with open_api(config_path) as api:
            for start in range(0, len(lines), MAX_BATCH_ITEMS):
                chunk = [item for _, item in lines[start : start + MAX_BATCH_ITEMS]]
                results.append(await api.submit_batch(BatchSubmitRequest(items=chunk)))
        return results

    results = run(go)
    # Item i of batch b is line lines[b * MAX_BATCH_ITEMS + i].
    outcomes: list[tuple[int, BatchItemResult]] = []
    for batch, result in enumerate(results):
        for item in result.items:
            outcomes.append((lines[batch * MAX_BATCH_ITEMS + item.index][0], item))
    refused = [(number, item) for number, item in outcomes if not item.created]
    if as_json:
        print_json([{"line": number, **msgspec.to_builtins(item)} for number, item in outcomes])
    else:
        for number, item in refused:
            click.echo(f"line {number}: refused [{item.code}]: {item.error}", err=True)
        click.echo(f"submitted {len(outcomes) - len(refused)}, refused {len(refused)}")
    if refused:
        sys.exit(1)
