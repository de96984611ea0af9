"""Property-based fuzzing of conduit's decoders and boundaries (issue 17).

Property, for every input: only the project's coded errors (a ``ConduitError`` with a ``code``),
never a crash (``RecursionError``, ``OverflowError``, ``re.error``, a ``msgspec`` error leaking
out) and never a hang; a refused input changes nothing in the store.

Bounded for CI by the ``default`` hypothesis profile (tests/conftest.py); a longer manual run:
``HYPOTHESIS_PROFILE=long .venv/bin/pytest -p no:randomly tests/core/test_fuzz_boundaries.py``.
"""

from __future__ import annotations

import json
import math
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conduit_core.cli._context import parse_json_option
from conduit_core.config import check_against_plugins, parse_config
from conduit_core.daemon import check_routine_specs
from conduit_core.errors import ConduitError
from conduit_core.extension import (
    decode_manifest,
    job_result,
    read_result_file,
)
from conduit_core.model import Event, Work, WorkKind
from conduit_core.plugins import Plugins
from conduit_core.runtime import ManualClock, Scheduler
from conduit_core.storage import open_store
from conduit_core.validation import AMOUNT_CEILING, saturating_add
from tests.runtime.conftest import options

PLUGINS = Plugins.load(disabled=())

# --- value strategies: what a hostile or unlucky file holds -----------------------------------

_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1.7e308, 1e306, -0.0, 5e-324, 2**63, 10**30]),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    _floats,
    st.text(max_size=40),
    st.sampled_from(["America", "x" * 300, "../../etc/x", "\x00", "\u0001", "a\nb", "UTC"]),
)


def _nested(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=20,
    )


def _deep(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


_keys = st.one_of(
    st.sampled_from(["b", "root", "team", "../../x", "", "\u0001", "a b", "x" * 200, "jobs"]),
    st.text(max_size=12),
)
_settings = st.fixed_dictionaries(
    {},
    optional={
        "lease_seconds": _scalars, "timeout_seconds": _scalars, "concurrency": _scalars,
        "job_concurrency": _scalars, "retry_delays_seconds": st.lists(_scalars, max_size=3),
        "store": st.sampled_from(["sqlite:////tmp/x.db", "ftp://h/x", "sqlite://", "a.db", ""]),
    },
)  # fmt: skip
_binding = st.fixed_dictionaries(
    {"executor": st.sampled_from(["echo", "shell", "container", "nope", "\x00"])},
    optional={
        "timeout_seconds": _scalars, "retry_delays_seconds": st.lists(_scalars, max_size=3),
        "config": st.dictionaries(st.sampled_from(["command", "image", "mounts", "comand"]),
                                  _nested(_scalars), max_size=3),
        "scope": _keys, "generation": _scalars,
    },
)  # fmt: skip
_routine = st.fixed_dictionaries(
    {"id": _keys, "cron": st.sampled_from(["* * * * *", "0 9-9 * * *", "61 * * * *", "once@x"]),
     "binding": st.sampled_from(["b", "missing"])},
    optional={"timezone": _scalars, "grace_seconds": _scalars, "input": _nested(_scalars)},
)  # fmt: skip
_config_docs = st.fixed_dictionaries(
    {},
    optional={
        "settings": _settings,
        "scopes": st.dictionaries(_keys, st.fixed_dictionaries({}, optional={"parent": _keys}),
                                  max_size=3),
        "bindings": st.dictionaries(_keys, _binding, max_size=3),
        "routines": st.lists(_routine, max_size=2),
        "budgets": st.lists(st.fixed_dictionaries({"name": _keys, "unit": _keys, "max": _scalars}),
                            max_size=2),
        "pools": st.dictionaries(_keys, st.fixed_dictionaries({"concurrency": _scalars}),
                                 max_size=2),
    },
)  # fmt: skip


def _toml_value(value: Any) -> str:
    # A tiny TOML writer (inline tables and arrays): the fuzz needs nan, inf and odd keys
    # spelled exactly, and no TOML writer is a dependency of the suite.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("-inf" if value < 0 else "inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        items = (f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None)
        return "{" + ", ".join(items) + "}"
    raise TypeError(type(value).__name__)


def _toml(doc: dict[str, Any]) -> bytes:
    lines = (f"{json.dumps(k)} = {_toml_value(v)}" for k, v in doc.items() if v is not None)
    return "\n".join(lines).encode("utf-8", "surrogatepass")


def _only_coded(exc: BaseException, code: str | None = None) -> None:
    assert isinstance(exc, ConduitError), f"{type(exc).__name__}: {exc}"
    assert exc.code == code if code is not None else exc.code, exc


# --- the config loader and `config check` ------------------------------------------------------


@given(_config_docs)
@example({"settings": {"lease_seconds": math.inf}, "scopes": {"\u0001": {}}})
@example({"bindings": {"b": {"executor": "echo", "config": _deep(200)}}})
def test_config_loader_and_check_raise_only_coded_errors(doc: Any) -> None:
    try:
        config = parse_config(_toml(doc))
        check_against_plugins(config, PLUGINS)
        check_routine_specs(config)
    except Exception as exc:
        _only_coded(exc)


@given(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
@example(b"a = " + b"[" * 5000 + b"]" * 5000)
@example(b".".join([b"a"] * 5000) + b" = 1")
@example(b'[scopes."\\u0001"]\n')
def test_config_loader_raises_only_coded_errors_on_arbitrary_bytes(raw: bytes) -> None:
    try:
        parse_config(raw)
    except Exception as exc:
        _only_coded(exc)


# --- the manifest decoder -----------------------------------------------------------------------

_manifest_docs = st.fixed_dictionaries(
    {"schema": _scalars, "package": _scalars},
    optional={
        "executors": st.lists(st.fixed_dictionaries(
            {"name": _scalars, "generation": _scalars},
            optional={"pool": _scalars, "historical_generations": st.lists(_scalars, max_size=3),
                      "capabilities": st.lists(_scalars, max_size=3), "extra": _nested(_scalars)},
        ), max_size=3),
        "gates": st.lists(st.fixed_dictionaries({"name": _scalars}), max_size=2),
    },
)  # fmt: skip


@given(st.one_of(_manifest_docs.map(_toml), st.binary(max_size=200)))
@example(b"schema = 1\npackage = 'x'\nx = " + b"[" * 4000 + b"]" * 4000)
def test_manifest_decoder_raises_only_coded_errors(raw: bytes | None) -> None:
    if raw is None:
        return
    try:
        decode_manifest(raw, source="fuzz.toml")
    except Exception as exc:
        _only_coded(exc)


# --- the result reader ---------------------------------------------------------------------------

_result_docs = st.fixed_dictionaries(
    {"outcome": st.sampled_from(["completed", "failed", "waiting", "nope", 3])},
    optional={
        "usage": st.fixed_dictionaries({}, optional={
            "units": st.dictionaries(st.sampled_from(["widgets", "minutes", "Bad Unit", "turns"]),
                                     _scalars, max_size=3),
            "cost": _scalars, "currency": _scalars, "input_tokens": _scalars,
        }),
        "summary": _scalars, "data": _nested(_scalars), "turn": _nested(_scalars),
    },
)  # fmt: skip


def _json(doc: Any) -> bytes | None:
    try:
        return msgspec.json.encode(doc)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return None


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(_result_docs.map(_json), st.binary(max_size=200)))
@example(b'{"outcome":"completed","usage":{"units":{"widgets":1.7e308}}}')
@example(b'{"outcome":"completed","data":' + b"[" * 990 + b"]" * 990 + b"}")
@example(b'{"outcome":"completed","usage":{"input_tokens":' + b"9" * 400 + b"}}")
def test_result_reader_raises_only_invalid_result(tmp_path: Path, raw: bytes | None) -> None:
    if raw is None:
        return
    path = tmp_path / "result.json"
    path.write_bytes(raw)
    try:
        read_result_file(path)
    except Exception as exc:
        _only_coded(exc, "invalid_result")
    # What an executor reports: never raises, a bad file is a failed attempt with its code.
    result = job_result(path, 0, wall_minutes=0.5)
    assert result.outcome is not None


# --- the CLI's --input ----------------------------------------------------------------------------


@given(
    st.one_of(st.text(max_size=200), _nested(_scalars).map(lambda v: (_json(v) or b"").decode()))
)
@example("[" * 5000 + "]" * 5000)
@example("\udcff\udcfe")  # undecodable argv bytes, as click hands them over
def test_cli_input_raises_only_coded_errors(text: str) -> None:
    try:
        parse_json_option(text, "--input")
    except Exception as exc:
        _only_coded(exc)


# --- budget ledger arithmetic ---------------------------------------------------------------------


@given(st.lists(_floats, min_size=1, max_size=20))
@example([1.7e308, 1.7e308])
def test_ledger_arithmetic_stays_finite_and_monotonic(amounts: list[float]) -> None:
    used = 0.0
    for amount in amounts:
        after = saturating_add(used, amount)
        assert math.isfinite(after)
        assert 0.0 <= after <= AMOUNT_CEILING
        assert after >= used
        used = after


# --- a refused submission changes nothing in the store ---------------------------------------------


@pytest.fixture(scope="module")
def store_file() -> Path:
    return Path(tempfile.mkdtemp(prefix="conduit-fuzz-")) / "fuzz.db"


def _row_counts(db: Path) -> tuple[int, int]:
    with sqlite3.connect(db) as conn:
        work = conn.execute("SELECT COUNT(*) FROM conduit_work").fetchone()[0]
        events = conn.execute("SELECT COUNT(*) FROM conduit_event").fetchone()[0]
    return int(work), int(events)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(st.text(max_size=140), st.sampled_from(["k:0", "a/b", "../../x", "a\n", "x" * 5000])),
    st.one_of(_nested(_scalars), st.just(_deep(100))),
)
def test_a_refused_submission_changes_nothing_in_the_store(
    store_file: Path, work_id: str, payload: Any
) -> None:
    async def go() -> None:
        async with await open_store(str(store_file)) as store:
            sched = Scheduler(store, ManualClock(), PLUGINS, options())
            before = _row_counts(store_file)
            now = sched.clock.now_ms()
            work = Work(id=work_id, scope="root", binding="agent", kind=WorkKind.TASK,
                        created_at_ms=now, updated_at_ms=now)  # fmt: skip
            first = Event(id=f"{work_id}/in", delivery_id=f"fuzz/{work_id}/in", type="input",
                          payload=payload, work_id=work_id, pending=True, accepted_at_ms=now)  # fmt: skip
            try:
                await sched.submit(work, first)
            except Exception as exc:
                _only_coded(exc)
                assert _row_counts(store_file) == before
            else:
                assert _row_counts(store_file) == (before[0] + 1, before[1] + 1)

    anyio.run(go)
