"""The current checkout against an older commit, side by side: attempts/s now over then.

    .venv/bin/python bench/bench_then_now.py --rounds 3
    .venv/bin/python bench/bench_then_now.py --rounds 3 --cases sqlite:4 sqlite:64 postgres:64
    .venv/bin/python bench/bench_then_now.py --commit b051fd1 --n 3000 --keep-worktree /tmp/then

Issue #14's throughput targets are absolute figures from another machine, written with the
figures the code of that time (b051fd1, the filing commit) gave there; so the fair measure is
the ratio now/then taken in one run on one machine. The older commit is checked out as a detached
``git worktree`` (removed at the end unless ``--keep-worktree``), and each case (``store:c``)
runs ``bench_scheduler.bench_one`` of either checkout, then and now alternately (which goes first
alternates each round), each run in a fresh process of this interpreter whose ``PYTHONPATH``
puts that checkout's ``src`` directories first, so the old code shadows the installed editable
packages. Installed plugins whose distribution the checkout does not have (the examples, for an
old commit) are disabled in that run. Prints each run as it ends, then per case the medians, the
ratio of the medians, each round's ratio and, against the filing commit, issue #14's target
ratio; the last line is all of it as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio

FILING_COMMIT = "b051fd1"
#: Issue #14's targets (attempts/s) over what bench_scheduler.py gave at the filing commit on the
#: machine the issue was written on (SQLite 513 / 1,131 / 3,215 at c=1 / 4 / 64; PostgreSQL
#: 264 / 572 at c=4 / 64): SQLite c=64 >= 5,000 and PostgreSQL c=64 >= 1,500.
TARGETS: dict[tuple[str, int], tuple[int, int]] = {
    ("sqlite", 64): (5000, 3215),
    ("postgres", 64): (1500, 572),
}
#: The entry point group plugins are installed under (conduit_core.extension's PROJECT_NAME).
PLUGIN_GROUP = "conduit"
SOURCE_GLOBS = ("*/src", "examples/*/src", "tests/plugins/*/src")
REPO = Path(__file__).resolve().parent.parent

Case = tuple[str, int]


def source_dirs(root: Path) -> list[Path]:
    return sorted(path for pattern in SOURCE_GLOBS for path in root.glob(pattern))


def normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def foreign_plugins(root: Path) -> list[str]:
    """Installed plugins whose distribution has no ``src`` directory in the checkout at ``root``."""
    ours = set()
    for src in source_dirs(root):
        pyproject = src.parent / "pyproject.toml"
        if pyproject.is_file():
            ours.add(normalize(tomllib.loads(pyproject.read_text())["project"]["name"]))
    return sorted(
        ep.name
        for ep in metadata.entry_points(group=PLUGIN_GROUP)
        if ep.dist is None or normalize(ep.dist.name) not in ours
    )


def nothing() -> None:
    pass


def drive(store: str, concurrency: int, n: int, bench_dir: Path) -> None:
    """One run in this process, with the ``bench_scheduler`` of the checkout ``bench_dir`` is
    in: prints its figures as one JSON line."""
    sys.path.insert(0, str(bench_dir))
    bs: Any = importlib.import_module("bench_scheduler")
    core = Path(sys.modules["conduit_core"].__file__ or "").resolve()
    if not core.is_relative_to(bench_dir.parent.resolve()):
        raise SystemExit(f"conduit_core came from {core}, not from {bench_dir.parent}")
    getattr(bs, "gates_as_a_user_has_them", nothing)()
    getattr(bs, "tune_garbage_collection", nothing)()
    foreign = foreign_plugins(bench_dir.parent)
    load = bs.Plugins.load

    def load_ours(*, disabled: Iterable[str] = (), **kwargs: Any) -> Any:
        return load(disabled=(*disabled, *foreign), **kwargs)

    bs.Plugins = SimpleNamespace(load=load_ours)  # bench_one's Plugins.load(disabled=())
    url, keep = bs.fresh_url(store)
    try:
        figures = anyio.run(bs.bench_one, url, n, concurrency)
    finally:
        cleanup = getattr(keep, "cleanup", None)
        if cleanup:
            cleanup()
    print(json.dumps({
        "attempts_per_s": round(n / float(figures["process_s"]), 1),
        "cpu_ms_per_attempt": figures.get("cpu_ms_per_attempt"),
        "disabled_plugins": foreign,
    }))  # fmt: skip


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


@contextlib.contextmanager
def checkout(commit: str, keep: Path | None) -> Iterator[Path]:
    """A detached worktree at ``commit``: ``keep`` (made if missing, left in place) or a
    temporary one, removed at the end however the run ends."""
    if keep is not None:
        keep = keep.resolve()
        if not keep.exists():
            git("worktree", "add", "--detach", str(keep), commit)
        if git("rev-parse", "HEAD", cwd=keep) != commit:
            raise SystemExit(f"{keep} is not a checkout of {commit}")
        yield keep
        return
    parent = Path(tempfile.mkdtemp(prefix="conduit-then-"))
    path = parent / "checkout"
    try:
        git("worktree", "add", "--detach", str(path), commit)
        yield path
    finally:
        if path.exists():
            git("worktree", "remove", "--force", str(path))
        shutil.rmtree(parent, ignore_errors=True)


def run_once(root: Path, case: Case, n: int) -> dict[str, Any]:
    """One run of ``case`` with the checkout at ``root``, in a fresh process."""
    store, concurrency = case
    paths = [str(p) for p in source_dirs(root)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--_run", store, str(concurrency), str(n),
         str(root / "bench")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"the run with {root} failed:\n{proc.stderr}")
    figures: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return figures


def summarize(case: Case, runs: dict[str, list[dict[str, Any]]], targeted: bool) -> dict[str, Any]:
    then = [r["attempts_per_s"] for r in runs["then"]]
    now = [r["attempts_per_s"] for r in runs["now"]]
    ratio = statistics.median(now) / statistics.median(then)
    summary: dict[str, Any] = {
        "then": runs["then"],
        "now": runs["now"],
        "then_median": statistics.median(then),
        "now_median": statistics.median(now),
        "ratio": round(ratio, 3),
        "round_ratios": [round(b / a, 3) for a, b in zip(then, now, strict=True)],
    }
    if targeted and case in TARGETS:
        target, filed = TARGETS[case]
        summary["target"] = f"{target}/{filed}"
        summary["target_ratio"] = round(target / filed, 3)
        summary["met"] = ratio >= target / filed
    return summary


def print_run(which: str, case: Case, round_no: int, figures: dict[str, Any]) -> None:
    cpu = figures["cpu_ms_per_attempt"]
    print(
        f"{which:4} {case[0]} c={case[1]} round {round_no}: "
        f"{figures['attempts_per_s']:,.0f} attempts/s"
        + (f" ({cpu} ms CPU/attempt)" if cpu is not None else ""),
        flush=True,
    )


def print_summary(case: Case, summary: dict[str, Any], commit: str) -> None:
    print(f"\n{case[0]} c={case[1]}")
    print(f"  then median      {summary['then_median']:>8,.0f} attempts/s  ({commit[:7]})")
    print(f"  now median       {summary['now_median']:>8,.0f} attempts/s")
    print(f"  ratio of medians {summary['ratio']:>8.3f}")
    print(f"  round ratios     {' '.join(f'{r:>8.3f}' for r in summary['round_ratios'])}")
    if "target_ratio" in summary:
        verdict = "met" if summary["met"] else "not met"
        print(
            f"  target ratio     {summary['target_ratio']:>8.3f}  "
            f"({summary['target']}, issue #14): {verdict}"
        )


def parse_case(text: str) -> Case:
    store, _, concurrency = text.partition(":")
    if store not in ("sqlite", "postgres") or not concurrency.isdigit():
        raise argparse.ArgumentTypeError(f"expected sqlite:C or postgres:C, got {text!r}")
    return store, int(concurrency)


def compare(args: argparse.Namespace) -> None:
    commit = git("rev-parse", "--verify", f"{args.commit}^{{commit}}")
    targeted = commit == git("rev-parse", "--verify", f"{FILING_COMMIT}^{{commit}}")
    runs: dict[Case, dict[str, list[dict[str, Any]]]] = {
        case: {"then": [], "now": []} for case in args.cases
    }
    with checkout(commit, args.keep_worktree) as then_root:
        roots = {"then": then_root, "now": REPO}
        for round_no in range(1, args.rounds + 1):
            order = ("then", "now") if round_no % 2 else ("now", "then")
            for case in args.cases:
                for which in order:
                    figures = run_once(roots[which], case, args.n)
                    runs[case][which].append(figures)
                    print_run(which, case, round_no, figures)
    summaries = {case: summarize(case, r, targeted) for case, r in runs.items()}
    for case, summary in summaries.items():
        print_summary(case, summary, commit)
    print(json.dumps({
        "then_commit": commit, "now_commit": git("rev-parse", "HEAD"),
        "now_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "n": args.n, "rounds": args.rounds,
        "cases": {f"{store}:{c}": summary for (store, c), summary in summaries.items()},
    }))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default=FILING_COMMIT)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument(
        "--cases", type=parse_case, nargs="+", default=[("sqlite", 64), ("postgres", 64)]
    )
    parser.add_argument("--keep-worktree", type=Path, help="check the commit out here; keep it")
    parser.add_argument("--_run", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._run:
        store, concurrency, n, bench_dir = args._run
        drive(store, int(concurrency), int(n), Path(bench_dir))
    else:
        compare(args)


if __name__ == "__main__":
    main()
