"""conduit in the peers' harness (../shared/peers): same CLI, same one JSON line.

    python bench/conduit_peer.py 2000 --store sqlite|postgres [--concurrency 4]

Enqueues N no-op Work one call at a time into a fresh store, then runs the scheduler in the
same process as users embed it (``conduit_core.embed``: the host loop ``conduit daemon`` runs)
at the given concurrency until all N completed, and prints
``{"peer": "conduit", "store": …, "n": …, "enqueue_s": …, "process_s": …, "jobs_per_s": …}``.
Run it side by side with the peers with ``bash bench/run_peers.sh`` (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json

import anyio
from bench_scheduler import bench_embedded, fresh_url  # type: ignore[import-not-found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=2000)
    parser.add_argument("--store", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    url, keep = fresh_url(args.store)
    try:
        figures = anyio.run(bench_embedded, url, args.n, args.concurrency)
    finally:
        cleanup = getattr(keep, "cleanup", None)
        if cleanup:
            cleanup()
    process_s = float(figures["process_s"])  # type: ignore[arg-type]
    print(json.dumps({
        "peer": "conduit", "store": args.store, "n": args.n, **figures,
        "jobs_per_s": round(args.n / process_s, 1), "concurrency": args.concurrency,
        "poll_s": None,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
