"""conduit.toml: decoding, key-path errors and the CLI check."""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit_core.config import check_against_plugins, load_config, parse_config
from conduit_core.errors import ConfigError
from conduit_core.plugins import Plugins

GOOD = """
[settings]
store = "state/conduit.db"
concurrency = 3
job_concurrency = 2
lease_seconds = 30

[scopes.team]
limits.concurrency = 2

[scopes.team-a]
parent = "team"

[bindings.build]
executor = "echo"
scope = "team-a"
timeout_seconds = 120
retry_delays_seconds = [1, 2, 3]
terminal_on_exhaustion = true
config = { command = ["make"] }

[bindings.old]
executor = "echo"
generation = 1

[[routines]]
id = "nightly"
cron = "0 3 * * *"
binding = "build"

[[budgets]]
name = "turns-per-work"
unit = "turns"
max = 10
warn_at = 0.8
"""


def test_good_config_decodes_with_defaults_and_scope_tree() -> None:
    config = parse_config(GOOD, source="c.toml")
    assert config.settings.concurrency == 3
    assert config.settings.timeout_seconds == 3600.0
    assert config.bindings["build"].timeout_seconds == 120
    assert config.bindings["build"].retry_delays_seconds == [1, 2, 3]
    assert config.scope_chain("team-a") == ("root", "team", "team-a")
    assert config.scopes["team"].limits.concurrency == 2
    check_against_plugins(config, Plugins.load(disabled=()))


def test_digest_is_stable_and_changes_with_content() -> None:
    a = parse_config(GOOD)
    assert parse_config(GOOD).digest == a.digest
    assert parse_config(GOOD.replace("concurrency = 3", "concurrency = 5")).digest != a.digest


def test_labels_and_requires_decode_and_join_the_digest_only_when_set() -> None:
    plain = parse_config(GOOD)
    # Written before labels existed: the digest (and so the config generation) is unchanged.
    assert plain.digest == "3d5c68b9b8296ebf10bd5efb6b7b5da130c8f86592e4be0b7c046f5252074006"
    assert plain.settings.labels == []
    assert plain.bindings["build"].requires == []
    labelled = GOOD.replace("lease_seconds = 30", 'lease_seconds = 30\nlabels = ["gpu", "eu"]')
    required = GOOD.replace('executor = "echo"\ngeneration = 1',
                            'executor = "echo"\ngeneration = 1\nrequires = ["gpu"]')  # fmt: skip
    assert parse_config(labelled).settings.labels == ["gpu", "eu"]
    assert parse_config(required).bindings["old"].requires == ["gpu"]
    assert len({plain.digest, parse_config(labelled).digest, parse_config(required).digest}) == 3


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ('labels = [""]', "$.settings.labels[0]"),
        ('labels = ["has space"]', "$.settings.labels[0]"),
        ('labels = ["gpu", "gpu"]', "$.settings.labels[1]"),
        ('labels = "gpu"', "$.settings.labels"),
        ("labels = [1]", "$.settings.labels[0]"),
    ],
)
def test_a_bad_label_is_refused_with_its_field(setting: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(GOOD.replace("lease_seconds = 30", f"lease_seconds = 30\n{setting}"))
    assert info.value.code == "invalid_label"
    assert field in info.value.message


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ('requires = [""]', "$.bindings.old.requires[0]"),
        ('requires = "gpu"', "$.bindings.old.requires"),
        ('requires = ["a", "b", "a"]', "$.bindings.old.requires[2]"),
    ],
)
def test_a_bad_requires_is_refused_with_its_field(setting: str, field: str) -> None:
    old = 'executor = "echo"\ngeneration = 1'
    doc = GOOD.replace(old, f"{old}\n{setting}")
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert info.value.code == "invalid_label"
    assert field in info.value.message


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("[settings\n", "not valid TOML"),
        (
            "[bindings.build]\nexecutor = 'echo'\ntimeout_seconds = 'soon'\n",
            "Expected `float | null`, got `str` - at `$.bindings.build.timeout_seconds`",
        ),
        (
            "[bindings.build]\nexecutor = 'echo'\ncolour = 1\n",
            "unknown field `colour` - at `$.bindings.build`",
        ),
        ("[settings]\nconcurrency = 0\n", "Expected `int` >= 1 - at `$.settings.concurrency`"),
        ("[setings]\nconcurrency = 2\n", "$.setings: unknown key"),
        (
            "[bindings.build]\nscope = 'x'\n",
            "missing required field `executor` - at `$.bindings.build`",
        ),
        (
            "[bindings.build]\nexecutor = 'echo'\nscope = 'nowhere'\n",
            "$.bindings.build.scope: unknown scope 'nowhere'",
        ),
        ("[scopes.a]\nparent = 'b'\n[scopes.b]\nparent = 'a'\n", "scopes form a cycle"),
        (
            "[[routines]]\nid = 'r'\ncron = '* * * * *'\nbinding = 'missing'\n",
            "$.routines[0].binding: unknown binding 'missing'",
        ),
        (
            "[[budgets]]\nname = 'b'\nunit = 'usd'\nmax = 1\nper = 'all'\nscope = 'root'\n",
            "$.budgets[0].scope: a per-all budget",
        ),
        ("[[budgets]]\nname = 'b'\nunit = 'USD'\nmax = 1\n", "at `$.budgets[0].unit`"),
        (
            "[settings]\nretry_delays_seconds = [" + ",".join(["1"] * 101) + "]\n",
            "$.settings.retry_delays_seconds: at most 100 delays",
        ),
    ],
)
def test_bad_config_names_the_key_path(doc: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(doc, source="bad.toml")
    # A number outside its bounds has its own code (issue 17); every other case is invalid_config.
    bound = expected.startswith(("Expected `int` >", "Expected `float` >"))
    assert caught.value.code == ("invalid_number" if bound else "invalid_config")
    assert caught.value.message.startswith("bad.toml: ")
    assert expected in caught.value.message


def test_binding_pinned_to_undeclared_generation_is_refused() -> None:
    config = parse_config("[bindings.b]\nexecutor = 'echo'\ngeneration = 9\n", source="g.toml")
    with pytest.raises(ConfigError) as caught:
        check_against_plugins(config, Plugins.load(disabled=()))
    assert caught.value.code == "unsupported_generation"
    assert "g.toml: $.bindings.b.generation:" in caught.value.message
    assert "'echo' generation 9 is not installed" in caught.value.message


def test_binding_naming_unknown_executor_is_refused() -> None:
    config = parse_config("[bindings.b]\nexecutor = 'nosuch'\n", source="u.toml")
    with pytest.raises(ConfigError, match=r"u\.toml: \$\.bindings\.b\.executor: executor 'nosuch'"):
        check_against_plugins(config, Plugins.load(disabled=()))


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "absent.toml")


def test_cli_config_check_ok_and_errors(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    proc = run_cli("config", "check", str(good))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"ok: {good}: 2 binding(s)")

    bad = tmp_path / "bad.toml"
    bad.write_text("[bindings.build]\nexecutor = 'echo'\ntimeout_seconds = 'soon'\n")
    proc = run_cli("config", "check", str(bad))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.strip() == (
        f"error [invalid_config]: {bad}: Expected `float | null`, got `str` - at "
        "`$.bindings.build.timeout_seconds`"
    )

    pinned = tmp_path / "pinned.toml"
    pinned.write_text("[bindings.b]\nexecutor = 'echo'\ngeneration = 9\n")
    proc = run_cli("config", "check", str(pinned))
    assert proc.returncode == 1
    assert proc.stderr.startswith("error [unsupported_generation]: ")


def test_cli_version(run_cli) -> None:  # type: ignore[no-untyped-def]
    from conduit_core import __version__

    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"conduit, version {__version__}"


@pytest.mark.parametrize(
    ("key", "problem"),
    [("{customer", "write each input field as {name}"), ("{a.b}", "write each input field"),
     ("", "1 to 256 printable characters")],
    ids=["open-brace", "dotted", "empty"],
)  # fmt: skip
def test_a_bad_concurrency_key_template_is_refused_naming_the_field(key: str, problem: str) -> None:
    doc = f"[bindings.b]\nexecutor = 'echo'\nconcurrency_key = '{key}'\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(doc, source="k.toml")
    assert caught.value.code == "invalid_concurrency_key"
    assert "k.toml: $.bindings.b.concurrency_key: " in caught.value.message
    assert problem in caught.value.message


def test_priorities_and_key_limits_are_bounded_and_default() -> None:
    config = parse_config("[bindings.b]\nexecutor = 'echo'\n", source="p.toml")
    assert (config.bindings["b"].priority, config.bindings["b"].key_limit) == (0, 1)
    assert config.bindings["b"].concurrency_key is None
    for doc in ("priority = 11", "priority = -11", "key_limit = 0"):
        with pytest.raises(ConfigError) as caught:
            parse_config(f"[bindings.b]\nexecutor = 'echo'\n{doc}\n", source="p.toml")
        assert caught.value.code == "invalid_number", doc
