"""``[executors.NAME]`` programs through the real CLI: ``conduit plugins list`` shows them (with
``--config`` or ``$CONDUIT_CONFIG``), a relative ``command`` resolves against the config file's
folder whatever the working directory, and ``conduit config check`` names the real file and the
resolved path of a program that is not there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROGUE = Path(__file__).resolve().parents[1] / "wire" / "_rogue_program.py"


def _conduit(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "CONDUIT_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "conduit_core.cli", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, env={**base, **(env or {})},
    )  # fmt: skip


def _setup(tmp_path: Path, command: str = "./bin/rogue") -> tuple[Path, Path]:
    """A config in conf/ whose program sits in conf/bin/, and another working directory."""
    conf = tmp_path / "conf"
    (conf / "bin").mkdir(parents=True)
    program = conf / "bin" / "rogue"
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{ROGUE}" plain\n')
    program.chmod(0o755)
    config = conf / "prod.toml"
    config.write_text(f'[executors.rogue]\ncommand = ["{command}"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return config, elsewhere


def _rogue_entry(listing: str) -> dict[str, object]:
    (entry,) = [e for e in json.loads(listing)["executors"] if e["name"] == "rogue"]
    return entry  # type: ignore[no-any-return]


def test_plugins_list_shows_the_programs_of_the_config(tmp_path: Path) -> None:
    config, elsewhere = _setup(tmp_path)
    resolved = str(config.parent / "bin" / "rogue")
    for args, env in (
        (("plugins", "list", "--json", "--config", str(config)), None),
        (("plugins", "list", "--json"), {"CONDUIT_CONFIG": str(config)}),
    ):
        done = _conduit(*args, cwd=elsewhere, env=env)
        assert done.returncode == 0, done.stderr
        entry = _rogue_entry(done.stdout)
        assert entry["command"] == [resolved]
        assert entry["declared_in"] == str(config)
        assert entry["generation"] == 1
    text = _conduit("plugins", "list", "--config", str(config), cwd=elsewhere)
    assert f"executor rogue        program={resolved} (declared in {config})" in text.stdout

    # Without any config, the installed packages only (no error); a named one must exist.
    bare = _conduit("plugins", "list", "--json", cwd=elsewhere)
    assert bare.returncode == 0, bare.stderr
    assert "rogue" not in [e["name"] for e in json.loads(bare.stdout)["executors"]]
    missing = _conduit("plugins", "list", "--config", str(tmp_path / "nope.toml"), cwd=elsewhere)
    assert missing.returncode == 1
    assert f"{tmp_path / 'nope.toml'}: no such config file (from --config)" in missing.stderr


def test_a_relative_command_resolves_against_the_config_folder(tmp_path: Path) -> None:
    config, elsewhere = _setup(tmp_path)
    done = _conduit("config", "check", str(config), cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ok: {config}")


def test_config_check_names_the_real_file_and_the_resolved_missing_program(
    tmp_path: Path,
) -> None:
    config, elsewhere = _setup(tmp_path, command="./bin/executor.pl")
    done = _conduit("config", "check", str(config), cwd=elsewhere)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"error [executor_command_not_found]: {config}: [executors.rogue] command[0]: "
        f"'{config.parent / 'bin' / 'executor.pl'}' does not exist ('./bin/executor.pl' is "
        "relative to the config file's folder)"
    )
    assert "conduit.toml" not in done.stderr


def test_config_check_names_the_real_file_when_the_program_exits_at_once(tmp_path: Path) -> None:
    config, elsewhere = _setup(tmp_path)
    (config.parent / "bin" / "rogue").write_text("#!/bin/sh\necho 'no JSON::PP' >&2\nexit 2\n")
    done = _conduit("config", "check", str(config), cwd=elsewhere)
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"error [executor_program_exited]: {config}: [executors.rogue]: executor 'rogue' "
    )
    assert "exited with status 2 before answering the handshake; it wrote: no JSON::PP" in (
        done.stderr
    )
    assert "conduit.toml" not in done.stderr
