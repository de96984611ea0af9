"""A newcomer's rough edges (issue 16), each through the real CLI (and a real daemon where one runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from conduit_core.cli._render import console, work_detail
from conduit_core.extension import Artifact, OutcomeKind, Result
from conduit_core.http import AttemptView, WorkDetail, WorkView
from conduit_core.model import ExecutionStatus, WorkKind, WorkStatus
from tests.daemon.conftest import Daemon


def _conduit(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conduit_core.cli", *args],
        capture_output=True, text=True, timeout=60, cwd=cwd, env=env,
    )  # fmt: skip


def test_a_missing_config_says_how_to_point_at_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CONDUIT_CONFIG"}
    done = _conduit("work", "list", cwd=tmp_path, env=env)
    assert done.returncode != 0
    assert "--config" in done.stderr
    assert "CONDUIT_CONFIG" in done.stderr
    assert "Traceback" not in done.stderr


def test_submit_without_a_daemon_says_none_runs_and_how_to_start_one(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon()  # configured, never started
    done = daemon.cli("work", "submit", "ok")
    assert done.stdout.startswith("submitted ")
    assert "no daemon is running" in done.stderr
    assert "conduit daemon --config" in done.stderr
    # With the daemon up, the same command says nothing of the kind.
    daemon.start()
    assert "no daemon" not in daemon.cli("work", "submit", "ok").stderr


def test_watch_prints_its_last_line_once_and_show_says_where_output_is(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon().start()
    work_id = daemon.submit("ok")
    daemon.wait_status(work_id, "completed")
    watched = daemon.cli("work", "watch", work_id).stdout
    assert watched.count(f"{work_id}  completed") == 1, watched
    shown = daemon.cli("work", "show", work_id).stdout
    stdout_line = next(line for line in shown.splitlines() if line.startswith("stdout: "))
    path = Path(stdout_line.removeprefix("stdout: ").split("  ")[0])
    assert path.read_text().strip() == "hello"
    assert any(line.startswith("stderr: ") for line in shown.splitlines())


def test_config_check_counts_only_declared_scopes(make_daemon: Callable[..., Daemon]) -> None:
    daemon = make_daemon()  # its config declares one scope, [scopes.team]
    done = _conduit("config", "check", str(daemon.config), cwd=daemon.root)
    assert done.returncode == 0, done.stderr
    assert " 1 scope(s)" in done.stdout


def test_routines_reconciled_is_logged_once_at_start(make_daemon: Callable[..., Daemon]) -> None:
    routine = '[[routines]]\nid = "tick"\ncron = "0 0 1 1 *"\nbinding = "ok"\n'
    daemon = make_daemon(extra=routine).start()
    assert daemon.log().count("routines reconciled") == 1, daemon.log()


def test_text_a_job_wrote_is_printed_as_written_not_as_markup() -> None:
    summary = "[bold red]not a style[/] [link=x]y[/link]"
    ref = "/w/[dim]out[/dim]"
    attempt = AttemptView(
        id="w#1", attempt=1, epoch=1, status=ExecutionStatus.FAILED, binding="b",
        executor="shell", executor_generation=3, config_generation=1, started_at_ms=0,
        ended_at_ms=1, failure_code="failed", failure_message=summary,
        result=Result(outcome=OutcomeKind.FAILED, summary=summary,
                      artifacts=[Artifact(name="stdout", ref=ref)]),
    )  # fmt: skip
    work = WorkView(
        id="w", scope="root", binding="b", kind=WorkKind.TASK, status=WorkStatus.FAILED,
        scheduled_by="manual", created_at_ms=0, updated_at_ms=1, last_attempt=1, failure_count=1,
    )  # fmt: skip
    out = console()
    with out.capture() as captured:
        out.print(f"submitted {summary}")
        out.print(work_detail(WorkDetail(work=work, attempts=[attempt])))
    text = captured.get()
    assert f"submitted {summary}" in text
    assert f"stdout: {ref}" in text


def test_run_state_goes_to_the_state_home_not_next_to_the_config(tmp_path: Path) -> None:
    config = tmp_path / "repo" / "conduit.toml"
    config.parent.mkdir()
    config.write_text('[bindings.hello]\nexecutor = "shell"\nconfig = { command = "echo hi" }\n')
    done = _conduit("work", "submit", "hello", "--config", str(config), cwd=config.parent)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in config.parent.iterdir()) == ["conduit.toml"]
    paths = _conduit("config", "paths", str(config), "--get", "store", cwd=tmp_path)
    store = Path(paths.stdout.strip())
    assert store.is_file()
    assert store.is_relative_to(os.environ["XDG_STATE_HOME"])
