"""conduit.toml at the boundary: bounded numbers, the name grammar, timezones, depth and size,
store URLs and pools. Each case was accepted (or crashed the loader) before issue 17.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import stat
import time
from pathlib import Path
from typing import cast

import pytest

from conduit_core.config import check_against_plugins, parse_config
from conduit_core.errors import ConfigError
from conduit_core.plugins import ExecutorInfo, Plugins
from conduit_core.storage import open_store_sync

BINDING = '[bindings.b]\nexecutor = "echo"\n'


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ("[settings]\nlease_seconds = 1e306\n", "$.settings.lease_seconds"),
        ("[settings]\nlease_seconds = nan\n", "$.settings.lease_seconds"),
        ("[settings]\ntimeout_seconds = inf\n", "$.settings.timeout_seconds"),
        ("[settings]\nretry_delays_seconds = [1.7e308]\n", "$.settings.retry_delays_seconds[0]"),
        ("[settings]\nconcurrency = 100000000000\n", "$.settings.concurrency"),
        (BINDING + "timeout_seconds = inf\n", "$.bindings.b.timeout_seconds"),
        (BINDING + "retry_delays_seconds = [nan]\n", "$.bindings.b.retry_delays_seconds[0]"),
        (
            BINDING + '[[routines]]\nid = "r"\ncron = "* * * * *"\nbinding = "b"\n'
            "grace_seconds = inf\n",
            "$.routines[0].grace_seconds",
        ),
        (
            '[[budgets]]\nname = "x"\nunit = "widgets"\nmax = 1.7e308\n',
            "$.budgets[0].max",
        ),
    ],
)
def test_non_finite_and_huge_numbers_are_refused_naming_the_field(doc: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert info.value.code == "invalid_number"
    assert f"`{field}`" in str(info.value)


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ('"../../x"', "$.bindings['../../x']"),
        ('""', "$.bindings['']"),
        ('"a\\u0000b"', "$.bindings['a\\x00b']"),
        ('"a b"', "$.bindings['a b']"),
        ('"' + "x" * 100_000 + '"', "$.bindings['xxxx"),
    ],
)
def test_binding_names_outside_the_grammar_are_refused(key: str, shown: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f'[bindings.{key}]\nexecutor = "echo"\n')
    assert info.value.code == "invalid_id"
    assert shown in str(info.value)


def test_a_scope_key_with_a_control_character_is_a_coded_error_not_re_error() -> None:
    # Was: re.error "bad escape \x" from the path substitution.
    with pytest.raises(ConfigError) as info:
        parse_config('[scopes."\\u0001"]\n')
    assert info.value.code == "invalid_id"
    with pytest.raises(ConfigError) as info:
        parse_config('[scopes."\\u0001"]\nlimits.concurrency = "x"\n')
    assert info.value.code == "invalid_id"


@pytest.mark.parametrize("zone", ["America", "x" * 300, "../../etc/passwd", "Mars/Olympus"])
def test_bad_timezones_are_refused_at_load_without_a_path(zone: str) -> None:
    doc = (
        BINDING
        + f'[[routines]]\nid = "r"\ncron = "0 9 * * *"\nbinding = "b"\ntimezone = "{zone}"\n'
    )
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert info.value.code == "invalid_timezone"
    assert "$.routines[0].timezone" in str(info.value)
    assert "/usr/share" not in str(info.value)
    assert "zoneinfo" not in str(info.value)


def test_a_good_timezone_passes() -> None:
    doc = BINDING + '[[routines]]\nid = "r"\ncron = "0 9 * * *"\nbinding = "b"\n'
    assert parse_config(doc + 'timezone = "America/New_York"\n').routines[0].timezone


@pytest.mark.parametrize(
    "doc",
    [
        "a = " + "[" * 3000 + "]" * 3000,
        "a = " + "{b = " * 3000 + "1" + "}" * 3000,
        BINDING + "config = { c = " + "[" * 70 + "]" * 70 + " }\n",
        ".".join(["a"] * 3000) + " = 1",
        "[" + ".".join(["s"] * 100_000) + "]",
    ],
    ids=["arrays", "inline-tables", "binding-config", "dotted-key", "dotted-header"],
)
def test_deep_toml_is_a_coded_error_quickly(doc: str) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert info.value.code == "too_deep"
    # Negative control for the hang: a 100,000-part dotted key took minutes in tomllib.
    assert time.monotonic() - started < 5


def test_a_config_over_the_size_limit_is_refused() -> None:
    doc = BINDING + "# " + "x" * (1024 * 1024) + "\n"
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert info.value.code == "too_large"


def test_non_utf8_config_is_a_coded_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(b'[bindings.b]\nexecutor = "\xff\xfe"\n')
    assert info.value.code == "invalid_config"


@pytest.mark.parametrize("store", ["ftp://host/x.db", "sqlite://", "sqlite:///", "a\x00b", "   "])
def test_bad_store_urls_are_refused_up_front(store: str) -> None:
    store_toml = store.replace("\x00", "\\u0000")
    with pytest.raises(ConfigError) as info:
        parse_config(f'[settings]\nstore = "{store_toml}"\n')
    assert info.value.code == "invalid_store_url"


def test_sqlalchemy_four_slash_store_url_opens_twice_and_is_never_called_corrupt(
    tmp_path: Path,
) -> None:
    db = tmp_path / "abs.db"
    url = f"sqlite:///{db}"  # "sqlite:" + "//" + "/" + "/tmp/…": four slashes in all
    assert url.startswith("sqlite:////")
    parse_config(f'[settings]\nstore = "{url}"\n')
    for _ in range(3):  # the second open was refused as store_corrupt (invalid uri authority)
        store = open_store_sync(url)
        store.close()
    assert db.exists()


def test_a_new_sqlite_store_and_its_wal_are_private(tmp_path: Path) -> None:
    db = tmp_path / "private.db"
    store = open_store_sync(str(db))
    try:
        wal = db.with_name(db.name + "-wal")
        assert wal.exists()
        for path in (db, wal):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    finally:
        store.close()
    # Negative control: sqlite3 alone creates the file with the umask's mode.
    other = tmp_path / "plain.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    assert stat.S_IMODE(other.stat().st_mode) != 0o600


def test_pools_declare_limits_and_jobs_is_reserved() -> None:
    config = parse_config("[pools.agents]\nconcurrency = 3\n")
    assert config.pools["agents"].concurrency == 3
    with pytest.raises(ConfigError) as info:
        parse_config("[pools.jobs]\nconcurrency = 3\n")
    assert info.value.code == "invalid_pool"
    with pytest.raises(ConfigError) as info:
        parse_config("[pools.agents]\nconcurrency = 0\n")
    assert info.value.code == "invalid_number"
    with pytest.raises(ConfigError) as info:
        parse_config('[pools."a/b"]\nconcurrency = 1\n')
    assert info.value.code == "invalid_id"


def test_the_digest_of_a_config_without_pools_is_unchanged() -> None:
    # Adding the pools table (and later settings.metrics and settings.tracing) must not move
    # every existing config to a new generation: the digest is what it was before them.
    import hashlib

    import msgspec

    config = parse_config(BINDING)
    settings = msgspec.to_builtins(config.settings)
    del settings["metrics"], settings["tracing"]  # the Settings fields of before
    del settings["http"]["wrong_token_limit"]  # nor http.wrong_token_limit, unless set
    del settings["labels"]  # nor settings.labels
    bindings = msgspec.to_builtins(config.bindings)
    later = ("requires", "priority", "concurrency_key", "key_limit", "on_dependency_failure",
             "dedup_key", "dedup", "dedup_window", "debounce")  # fmt: skip
    for binding in bindings.values():
        for field in later:  # nor a binding's fields that joined later (labels, issue 36)
            del binding[field]
    old = hashlib.sha256(
        msgspec.json.encode(
            [settings, config.scopes, bindings, config.routines, config.budgets],
            order="sorted",
        )
    ).hexdigest()
    assert config.digest == old
    assert parse_config(BINDING + "[pools.x]\nconcurrency = 1\n").digest != old
    # Set, they are part of the config like any other key.
    assert parse_config("[settings]\nmetrics.open = true\n" + BINDING).digest != old
    assert parse_config("[settings]\ntracing.enabled = true\n" + BINDING).digest != old
    assert parse_config("[settings]\nmetrics.open = false\n" + BINDING).digest == old
    assert parse_config('[settings]\nlabels = ["gpu"]\n' + BINDING).digest != old
    assert parse_config("[settings]\nlabels = []\n" + BINDING).digest == old
    assert parse_config(BINDING + "priority = 2\n").digest != old
    assert parse_config(BINDING + "priority = 0\n").digest == old


class _PooledPlugins:
    """The installed executors, with ``echo`` declaring pool ``agents`` (only executors() is read)."""

    def __init__(self) -> None:
        self._infos = [
            dataclasses.replace(info, pool="agents") if info.name == "echo" else info
            for info in Plugins.load().executors()
        ]

    def executors(self) -> list[ExecutorInfo]:
        return self._infos

    def check_binding_config(self, name: str, generation: int, config: object) -> None:
        pass


def test_a_binding_on_an_executor_whose_pool_has_no_limit_is_refused() -> None:
    plugins = cast(Plugins, _PooledPlugins())
    with pytest.raises(ConfigError) as err:
        check_against_plugins(parse_config(BINDING), plugins)
    assert err.value.code == "unknown_pool"
    assert "[pools.agents]" in str(err.value)
    assert "$.bindings.b.executor" in str(err.value)
    # Declared: accepted. And the jobs pool needs no declaration (settings.job_concurrency).
    check_against_plugins(parse_config(BINDING + "[pools.agents]\nconcurrency = 2\n"), plugins)
    check_against_plugins(parse_config('[bindings.s]\nexecutor = "shell"\n'), plugins)


def test_pool_limits_reach_the_scheduler_options() -> None:
    from conduit_core.runtime import SchedulerOptions

    config = parse_config("[pools.agents]\nconcurrency = 3\n")
    options = SchedulerOptions.from_config(config, config_generation=1, owner="t")
    assert options.capacity().pool_limits == {"agents": 3, "jobs": 4}


@pytest.mark.parametrize(
    ("binding", "field"),
    [
        ('executor = "shell"\nconfig = { comand = "typo" }', "comand"),
        ('executor = "shell"\nconfig = { command = "true", stop_grace_seconds = "soon" }',
         "stop_grace_seconds"),
        ('executor = "container"\nconfig = { command = "true" }', "image"),
        ('executor = "container"\nconfig = { image = "x", mounts = [{ source = "/a", '
         'target = "//conduit" }] }', "$.mounts[0].target"),
    ],
)  # fmt: skip
def test_executors_declare_their_binding_config_and_config_check_applies_it(
    binding: str, field: str
) -> None:
    # Issue 13: a bad binding config was first met when an attempt ran.
    config = parse_config(f"[bindings.b]\n{binding}\n")
    with pytest.raises(ConfigError) as info:
        check_against_plugins(config, Plugins.load())
    assert info.value.code == "invalid_config"
    assert "$.bindings.b.config: " in str(info.value)
    assert field in str(info.value)


def test_good_binding_configs_pass_the_declared_checks() -> None:
    config = parse_config(
        '[bindings.s]\nexecutor = "shell"\nconfig = { command = "echo hi" }\n'
        '[bindings.c]\nexecutor = "container"\nconfig = { image = "busybox", command = "true" }\n'
    )
    check_against_plugins(config, Plugins.load())  # negative control: nothing raised


@pytest.mark.parametrize(
    ("line", "path"),
    [
        ('metrics.open = "yes"', "$.settings.metrics.open"),
        ("metrics.public = true", "$.settings.metrics"),
        ('tracing.exporter = "jaeger"', "$.settings.tracing.exporter"),
        ('tracing.service_name = ""', "$.settings.tracing.service_name"),
    ],
)
def test_metrics_and_tracing_settings_are_checked_with_their_key_path(line: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(f"[settings]\n{line}\n" + BINDING)
    assert f"`{path}`" in info.value.message
    assert parse_config("[settings]\nmetrics.open = true\n" + BINDING).settings.metrics.open
