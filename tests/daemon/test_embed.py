"""The scheduler embedded in a Python process (conduit_core.embed), on both stores.

Real processes and real shell jobs: a process that embeds the scheduler is SIGKILLed mid-job; a
second one takes over the dead one's leases at once (the lease is 120 s, longer than the test
waits, so adoption can only come from the dead-predecessor proof), adopts the still-running
job, and the job runs once. No fixed sleeps: every wait is a condition with a deadline.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import msgspec
import pytest

from conduit_core import embed
from conduit_core.client import ConduitClientError, SubmitItem
from tests.daemon.conftest import _kill_jobs_under, wait_for

LONG_LEASE = 120

CONFIG = """\
[settings]
store = "{store}"
data_dir = "{root}/data"
lease_seconds = {lease}

[bindings.held]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID start" >> {root}/side; while test ! -e {root}/release; do sleep 0.05; done; echo "$CONDUIT_WORK_ID end" >> {root}/side' }}

[bindings.report]
executor = "shell"
config = {{ command = '''n=$(sed -n 's/.*"payload":\\([0-9]*\\).*/\\1/p'); printf '{{"outcome":"completed","data":{{"rows":%s}}}}' "$n" > "$CONDUIT_RESULT"''' }}
"""

#: The embedding program: ``submit`` starts a held job and waits for ever (to be killed);
#: ``recover`` prints ``adopted`` once the job runs under its second epoch, then its outcome.
PROGRAM = """\
import json, logging, sys, time
import anyio
from conduit_core import embed

logging.basicConfig(level=logging.INFO)

async def main(config: str, mode: str) -> None:
    async with embed.run(config, rescan_s=0.2) as scheduler:
        if mode == "submit":
            await scheduler.submit("held", id="job-1")
            print("submitted", flush=True)
            await anyio.sleep_forever()
        deadline = time.monotonic() + 60  # well before the dead one's 120 s leases expire
        while time.monotonic() < deadline:
            detail = await scheduler.get("job-1")
            last = detail.attempts[-1] if detail.attempts else None
            if last is not None and (last.epoch, last.status) == (2, "running"):
                break
            await scheduler.attempt_ended(0.1)
        print("adopted", detail.attempts[-1].status, flush=True)
        outcome = await scheduler.wait("job-1", timeout=60)
        detail = await scheduler.get("job-1")
        print(json.dumps({"status": outcome.status, "attempts": outcome.attempts,
                          "epoch": detail.attempts[-1].epoch}), flush=True)

anyio.run(main, sys.argv[1], sys.argv[2])
"""


def _write_config(root: Path, store: str) -> Path:
    config = root / "conduit.toml"
    config.write_text(CONFIG.format(store=store, root=root, lease=LONG_LEASE))
    return config


def _embedding(root: Path, config: Path, mode: str) -> subprocess.Popen[str]:
    program = root / "embedding.py"
    program.write_text(PROGRAM)
    with (root / f"{mode}.log").open("w") as log:
        return subprocess.Popen(
            [sys.executable, str(program), str(config), mode],
            stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip


def _line(proc: subprocess.Popen[str], root: Path, mode: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"the {mode} process ended early: {(root / f'{mode}.log').read_text()}"
    return line.strip()


def _runs(root: Path, word: str) -> int:
    side = root / "side"
    return side.read_text().split().count(word) if side.exists() else 0


async def _refused_while_it_runs(config: Path) -> str:
    try:
        async with embed.run(config):
            return "started"
    except ConduitClientError as exc:  # pragma: no cover - the wrong kind of refusal
        return f"client:{exc.code}"
    except Exception as exc:
        return str(getattr(exc, "code", type(exc).__name__))


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_killed_embedding_process_is_recovered_by_the_next_and_the_job_runs_once(
    store_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = (
        str(tmp_path / "conduit.db")
        if store_kind == "sqlite"
        else str(request.getfixturevalue("postgres_url"))
    )
    config = _write_config(tmp_path, store)
    first = _embedding(tmp_path, config, "submit")
    second: subprocess.Popen[str] | None = None
    try:
        assert _line(first, tmp_path, "submit") == "submitted"
        wait_for("the job to start", lambda: _runs(tmp_path, "start") == 1)
        # One process per data dir: a second one is refused while the first lives.
        assert anyio.run(_refused_while_it_runs, config) == "daemon_running"
        # The CLI works beside it, on the store directly (the process serves no HTTP).
        listed = subprocess.run(
            [sys.executable, "-m", "conduit_core.cli", "work", "list", "--json",
             "--config", str(config)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert "job-1" in listed.stdout
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        second = _embedding(tmp_path, config, "recover")
        adopted = _line(second, tmp_path, "recover")
        assert adopted == "adopted running", adopted
        (tmp_path / "release").touch()
        result = json.loads(_line(second, tmp_path, "recover"))
        assert result == {"status": "completed", "attempts": 1, "epoch": 2}
        assert second.wait(timeout=30) == 0
        assert _runs(tmp_path, "start") == 1
        assert _runs(tmp_path, "end") == 1
        assert "is dead" in (tmp_path / "recover.log").read_text()
    finally:
        for proc in (first, second):
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                assert proc.stdout is not None
                proc.stdout.close()
        _kill_jobs_under(tmp_path)


class Report(msgspec.Struct):
    rows: int


def test_the_blocking_embedding_runs_a_job_and_reads_its_typed_result(tmp_path: Path) -> None:
    config = _write_config(tmp_path, str(tmp_path / "conduit.db"))
    with embed.Embedded(config, rescan_s=0.2) as scheduler:
        work = scheduler.submit("report", 42)
        outcome = scheduler.wait(work.work.id, timeout=30, data_type=Report)
        assert outcome.status == "completed"
        assert outcome.data == Report(rows=42)
        with pytest.raises(ConduitClientError) as refused:
            scheduler.submit("missing")
        assert refused.value.code == "unknown_binding"
        batch = scheduler.submit_many(
            [embed_item("report", 1), embed_item("missing", 2), embed_item("report", 3)]
        )
        assert [(i.index, i.created, i.code) for i in batch.items] == [
            (0, True, None), (1, False, "unknown_binding"), (2, True, None),
        ]  # fmt: skip
    # Stopped gracefully: the pid file is gone, so the next start has no predecessor to prove.
    assert not embed.PidFile.in_dir(tmp_path / "data").path.exists()


def embed_item(binding: str, value: int) -> SubmitItem:
    return SubmitItem(binding=binding, input=value)


def test_importing_the_embedding_api_works_from_a_clean_interpreter() -> None:
    code = textwrap.dedent(
        """
        import conduit_core.embed as e
        from conduit_core.embed import Embedded, EmbeddedScheduler, PidFile, run
        print(sorted(e.__all__))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "'run'" in out.stdout
