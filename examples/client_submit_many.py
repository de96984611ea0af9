"""Submit many jobs from application code and read their typed results back.

Start a daemon for the example config, then run this script:

    .venv/bin/conduit daemon --config examples/conduit.toml &
    .venv/bin/python examples/client_submit_many.py --config examples/conduit.toml

It submits ``--count`` jobs (1,000 by default) of the ``echo-back`` binding in batches of up to
1,000 (``POST /v1/work/batch``), waits for all of them, and decodes each result's data into the
``Echoed`` Struct below. The daemon can also be named with ``CONDUIT_URL`` and ``CONDUIT_TOKEN``.
"""

from __future__ import annotations

import argparse
import sys
import time

import msgspec

from conduit_core.client import Client, SubmitItem


class Order(msgspec.Struct):
    """What we submit as each job's input."""

    n: int
    label: str


class Event(msgspec.Struct):
    """The input event as the job saw it on stdin (other fields are ignored)."""

    payload: Order


class Echoed(msgspec.Struct):
    """The job's result data (``{"event": …}``), decoded into types we own."""

    event: Event


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--binding", default="echo-back")
    parser.add_argument("--config", default=None, help="the daemon's conduit.toml")
    parser.add_argument("--url", default=None, help="http://HOST:PORT (else $CONDUIT_URL)")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)

    started = time.monotonic()
    with Client(args.url, config=args.config) as client:
        items = [
            SubmitItem(binding=args.binding, input=Order(n=i, label=f"order-{i}"))
            for i in range(args.count)
        ]
        batch = client.submit_many(items)
        if batch.refused:
            first = next(item for item in batch.items if not item.created)
            print(f"{batch.refused} refused, first: [{first.code}] {first.error}", file=sys.stderr)
            return 1
        submitted = time.monotonic()
        outcomes = client.wait_many(batch.ids, timeout=args.timeout, data_type=Echoed)

    failed = [o for o in outcomes if not o.ok]
    total = 0
    for i, outcome in enumerate(outcomes):
        if outcome.data is not None:
            assert outcome.data.event.payload.n == i, "results come back in submit order"
            total += outcome.data.event.payload.n
    done = time.monotonic()
    print(
        f"submitted {args.count} in {submitted - started:.2f} s, all settled after "
        f"{done - started:.2f} s: {len(outcomes) - len(failed)} completed, {len(failed)} not; "
        f"sum of n = {total}"
    )
    for outcome in failed[:5]:
        print(f"  {outcome.id}: {outcome.status} {outcome.failure_code}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
