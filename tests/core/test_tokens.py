"""``[[tokens]]``: the config section, the token files' checks (daemon start, ``config check``,
``conduit doctor``), the principal of a presented token, and the wrong-token throttle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conduit_core.cli._doctor import _token_check
from conduit_core.config import load_config, parse_config
from conduit_core.daemon import DaemonPaths
from conduit_core.errors import ConduitError, ConfigError
from conduit_core.http._tokens import (
    LoginThrottle,
    Principal,
    TokenSet,
    load_tokens,
    token_problems,
)

BASE = """
[settings]
data_dir = "data"

[bindings.ok]
executor = "shell"
config = { command = "true" }
"""


def _token(path: Path, secret: str, mode: int = 0o600) -> None:
    path.write_text(secret + "\n")
    os.chmod(path, mode)


def _config(tmp_path: Path, tokens: str) -> Path:
    file = tmp_path / "conduit.toml"
    file.write_text(BASE + tokens)
    return file


def test_the_section_is_checked_and_names_the_entry() -> None:
    ok = parse_config(BASE + '[[tokens]]\nname = "ci"\nrole = "operator"\nfile = "ci.token"\n')
    assert [(t.name, t.role, t.file) for t in ok.tokens] == [("ci", "operator", "ci.token")]
    assert ok.digest == parse_config(BASE).digest  # tokens never change the config generation
    with pytest.raises(ConfigError, match=r"\$\.tokens\[0\]\.role"):
        parse_config(BASE + '[[tokens]]\nname = "ci"\nrole = "root"\nfile = "x"\n')
    with pytest.raises(ConfigError, match=r"\$\.tokens\[1\]\.name: 'ci' is already") as dup:
        parse_config(BASE + '[[tokens]]\nname = "ci"\nrole = "viewer"\nfile = "a"\n'
                     '[[tokens]]\nname = "ci"\nrole = "viewer"\nfile = "b"\n')  # fmt: skip
    assert dup.value.code == "duplicate_token"
    with pytest.raises(ConfigError, match=r"unknown field `secret` - at `\$\.tokens\[0\]`"):
        parse_config(BASE + '[[tokens]]\nname = "ci"\nrole = "viewer"\nfile = "a"\nsecret = "x"\n')


def test_token_files_are_checked_like_the_daemons_own(tmp_path: Path) -> None:
    file = _config(tmp_path, '[[tokens]]\nname = "ci"\nrole = "viewer"\nfile = "ci.token"\n'
                   '[[tokens]]\nname = "ops"\nrole = "operator"\nfile = "/nonexistent/x"\n')  # fmt: skip
    config = load_config(file)
    default = DaemonPaths.from_config(config).token_file
    _token(tmp_path / "ci.token", "s1", mode=0o644)
    codes = [(p.code, p.message.split(":")[0]) for p in token_problems(config, default)]
    assert codes == [("token_insecure", "token 'ci'"), ("token_missing", "token 'ops'")]
    with pytest.raises(ConduitError) as refused:
        load_tokens(config, default)  # the daemon refuses to start
    assert refused.value.code == "token_insecure"
    check = _token_check(config, DaemonPaths.from_config(config))
    assert check.status == "fail"
    assert "token 'ci'" in check.message
    assert "chmod 600" in check.message
    assert "s1" not in check.message
    done = subprocess.run([sys.executable, "-m", "conduit_core.cli", "config", "check", str(file)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert "token 'ci'" in done.stderr
    assert "token_insecure" in done.stderr


def test_the_daemons_own_token_is_the_default_admin_unless_an_entry_names_it(
    tmp_path: Path,
) -> None:
    _token(tmp_path / "ci.token", "secret-ci")
    config = load_config(_config(tmp_path, '[[tokens]]\nname = "ci"\nrole = "viewer"\n'
                                 'file = "ci.token"\n'))  # fmt: skip
    default = DaemonPaths.from_config(config).token_file
    tokens = load_tokens(config, default)  # creates the daemon's own file (0600)
    own = default.read_text().strip()
    assert tokens.identify(own) == Principal("default", "admin")
    assert tokens.identify("secret-ci") == Principal("ci", "viewer")
    assert tokens.identify("secret-c") is None
    assert tokens.identify("") is None
    assert token_problems(config, default) == []
    assert _token_check(config, DaemonPaths.from_config(config)).message == (
        "default (admin), ci (viewer)"
    )
    named = load_config(_config(tmp_path, f'[[tokens]]\nname = "lead"\nrole = "operator"\n'
                                f'file = "{default}"\n'))  # fmt: skip
    assert load_tokens(named, default).principals == [Principal("lead", "operator")]
    _token(tmp_path / "ci.token", own)  # the same secret twice is refused
    with pytest.raises(ConduitError, match="same secret") as same:
        load_tokens(config, default)
    assert same.value.code == "invalid_tokens"


def test_roles_include_the_ones_below() -> None:
    viewer, operator, admin = (Principal(r, r) for r in ("viewer", "operator", "admin"))
    assert [p.allows("operator") for p in (viewer, operator, admin)] == [False, True, True]
    assert [p.allows("admin") for p in (viewer, operator, admin)] == [False, False, True]
    assert TokenSet.of("t").identify("t") == Principal("default", "admin")


def test_the_throttle_blocks_an_address_doubling_and_keeps_bounded_memory() -> None:
    now = [0.0]
    throttle = LoginThrottle(limit=3, window=60, block=10, max_block=25, max_clients=100,
                             clock=lambda: now[0])  # fmt: skip
    for _ in range(2):
        throttle.failed("a")
    assert throttle.retry_after("a") is None
    throttle.failed("a")
    assert throttle.retry_after("a") == 10
    assert throttle.retry_after("b") is None  # per address
    now[0] = 10.5
    assert throttle.retry_after("a") is None
    for _ in range(3):
        throttle.failed("a")
    assert throttle.retry_after("a") == 20  # the second block is twice as long
    now[0] = 40.0
    for _ in range(3):
        throttle.failed("a")
    assert throttle.retry_after("a") == 25  # capped
    # Failures further apart than the window never add up to a block.
    now[0] = 1000.0
    for step in range(5):
        now[0] += 61
        throttle.failed(f"slow{step % 1}")
    assert throttle.retry_after("slow0") is None
    for n in range(1000):
        throttle.failed(f"10.0.{n // 250}.{n % 250}")
    assert len(throttle) == 100


def test_rows_written_before_actors_still_decode() -> None:
    import msgspec

    from conduit_core.model import ControlIntent, Event, Work

    event = msgspec.json.decode(
        b'{"id":"e","delivery_id":"e","type":"core.input","accepted_at_ms":1}', type=Event
    )
    work = msgspec.json.decode(
        b'{"id":"w","scope":"root","binding":"b","created_at_ms":1,"updated_at_ms":1}', type=Work
    )
    intent = msgspec.json.decode(
        b'{"id":"i","work_id":"w","execution_id":"x","epoch":1,"kind":"interrupt",'
        b'"created_at_ms":1}',
        type=ControlIntent,
    )
    assert (event.actor, work.cancelled_by, intent.actor) == (None, None, None)


def test_the_throttle_setting_joins_the_digest_only_when_changed() -> None:
    plain = parse_config(BASE)
    same = parse_config(BASE.replace('data_dir = "data"', 'data_dir = "data"\nhttp.wrong_token_limit = 10'))
    off = parse_config(BASE.replace('data_dir = "data"', 'data_dir = "data"\nhttp.wrong_token_limit = 0'))
    assert same.digest == plain.digest
    assert off.digest != plain.digest
    assert off.settings.http.wrong_token_limit == 0
