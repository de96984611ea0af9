"""The shared validation rules: the id/name grammar, bounded numbers, depth and size limits.

Expected numbers are the documented ones (docs/configuration.md "Limits"), not imported.
"""

from __future__ import annotations

import math
import re

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conduit_core.errors import ConduitError
from conduit_core.validation import (
    NAME_PATTERN,
    WORK_ID_PATTERN,
    InvalidIdError,
    InvalidNumberError,
    InvalidValueError,
    TooDeepError,
    TooLargeError,
    WorkIdStr,
    check_depth,
    check_json_depth,
    check_name,
    check_size,
    check_text,
    check_timezone,
    check_toml_keys,
    check_work_id,
    decode_bounded,
    finite_number,
    saturating_add,
)


@pytest.mark.parametrize("good", ["a", "k:0", "k_0", "A.b-c:9", "x" * 128, "0"])
def test_valid_work_ids_pass(good: str) -> None:
    assert check_work_id(good) == good


@pytest.mark.parametrize(
    "bad",
    ["", "a b", "a/b", "../../etc/x", "a\nb", "a\n", "\x00", "a\x01", "..", ".a", "-a", ":a",
     "x" * 129, "x" * 5000, "é"],
)  # fmt: skip
def test_invalid_work_ids_are_refused_with_the_field(bad: str) -> None:
    with pytest.raises(InvalidIdError) as info:
        check_work_id(bad, "$.id")
    assert info.value.code == "invalid_id"
    assert info.value.field == "$.id"
    assert isinstance(info.value, ConduitError)
    assert "$.id" in info.value.message


def test_names_refuse_colon_and_control_characters() -> None:
    assert check_name("build.main-1", "$.bindings") == "build.main-1"
    for bad in ("a:b", "\x01", "", "../../x", "x" * 100_000, "a\n"):
        with pytest.raises(InvalidIdError):
            check_name(bad, "$.bindings")


def test_the_patterns_refuse_a_trailing_newline_through_msgspec_too() -> None:
    # Python's "$" matches before a final newline; the documented pattern must not.
    assert msgspec.convert("k:0", WorkIdStr) == "k:0"
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert("k:0\n", WorkIdStr)
    # Negative control: the naive pattern would have let it through.
    assert re.match(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$", "k:0\n")
    assert not re.match(WORK_ID_PATTERN, "k:0\n")
    assert not re.match(NAME_PATTERN, "k\n")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e306, 10**400, -1, True, "5"])
def test_finite_number_refuses_non_finite_huge_negative_and_non_numbers(bad: object) -> None:
    with pytest.raises(InvalidNumberError) as info:
        finite_number("$.settings.lease_seconds", bad, minimum=0, maximum=1e6)
    assert info.value.code == "invalid_number"
    assert "$.settings.lease_seconds" in str(info.value)


def test_finite_number_bounds() -> None:
    assert finite_number("f", 5, minimum=0, maximum=10) == 5.0
    assert finite_number("f", 0, minimum=0) == 0.0
    with pytest.raises(InvalidNumberError):
        finite_number("f", 0, minimum=0, positive=True)
    with pytest.raises(InvalidNumberError):
        finite_number("f", 10.5, maximum=10)


def test_saturating_add_never_overflows_and_reads_a_bad_stored_amount_as_exhausted() -> None:
    assert saturating_add(1.0, 2.0) == 3.0
    # The observed overflow: 1.7e308 twice is inf, which JSON stores as null.
    assert math.inf == 1.7e308 + 1.7e308
    total = saturating_add(1.7e308, 1.7e308)
    assert math.isfinite(total)
    assert total == 1e300
    assert saturating_add(math.nan, 1.0) == 1e300
    assert saturating_add(math.inf, 0.0) == 1e300
    assert saturating_add(5.0, -3.0) == 5.0


@pytest.mark.parametrize("bad", ["America", "x" * 300, "../etc/passwd", "/etc/localtime", "A//B",
                                 "", "Foo/Bar", "UTC\n", "Europe/"])  # fmt: skip
def test_timezone_refusals_are_coded_and_do_not_leak_paths(bad: str) -> None:
    with pytest.raises(InvalidValueError) as info:
        check_timezone("$.routines[0].timezone", bad)
    assert info.value.code == "invalid_timezone"
    assert "zoneinfo" not in str(info.value)
    assert "/usr/share" not in str(info.value)


def test_a_real_timezone_is_returned() -> None:
    assert str(check_timezone("tz", "Europe/Paris")) == "Europe/Paris"
    assert str(check_timezone("tz", "UTC")) == "UTC"


def test_depth_is_checked_iteratively_at_the_documented_limit_of_64() -> None:
    nested: object = 1
    for _ in range(64):
        nested = [nested]
    check_depth(nested)  # exactly 64 levels: allowed
    with pytest.raises(TooDeepError) as info:
        check_depth({"a": nested}, "$.input")
    assert info.value.code == "too_deep"
    assert info.value.field == "$.input"
    very: object = {}
    for _ in range(100_000):  # far past the interpreter's recursion limit
        very = {"a": very}
    with pytest.raises(TooDeepError):
        check_depth(very)


#: JSON values whose strings are full of brackets, quotes and backslashes, nested a few deep
#: or, wrapped below, around the limit.
_TRICKY_TEXT = st.text(alphabet='[]{}"\\ax\u00e9\n', max_size=12)
_JSON_VALUES = st.recursive(
    st.none() | st.integers() | _TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY_TEXT, inner, max_size=3),
    max_leaves=12,
)


def _verdict(check: object, value: object) -> bool:
    try:
        check(value)  # type: ignore[operator]
    except TooDeepError:
        return False
    return True


@given(_JSON_VALUES, st.integers(min_value=0, max_value=70))
def test_the_depth_read_from_json_text_is_the_depth_of_what_it_decodes_to(
    value: object, wraps: int
) -> None:
    for _ in range(wraps):
        value = [value] if wraps % 2 else {"k[": value}
    raw = msgspec.json.encode(value)
    assert _verdict(check_json_depth, raw) == _verdict(check_depth, msgspec.json.decode(raw))


def test_json_text_depth_counts_only_brackets_outside_strings() -> None:
    deep = b"[" * 64 + b"]" * 64
    check_json_depth(deep)  # 64 levels: allowed
    with pytest.raises(TooDeepError) as info:
        check_json_depth(b"{\"a\":" + deep + b"}", "$.input")
    assert info.value.field == "$.input"
    check_json_depth(b'["' + b"[" * 200 + b'\\\"{{", {"a": "]]]"}]')  # brackets in strings


def test_decode_bounded_turns_recursion_into_too_deep_and_checks_size() -> None:
    for depth in (65, 500, 5000):
        raw = b"[" * depth + b"]" * depth
        with pytest.raises(TooDeepError):
            decode_bounded(msgspec.json.decode, raw, field="$.input")
    assert decode_bounded(msgspec.json.decode, b"[[1]]", field="$") == [[1]]
    with pytest.raises(TooLargeError) as info:
        decode_bounded(msgspec.json.decode, b" " * 101 + b"1", field="$", max_bytes=100)
    assert info.value.code == "too_large"
    with pytest.raises(msgspec.DecodeError):  # the decoder's own errors are the caller's to word
        decode_bounded(msgspec.json.decode, b"[", field="$")
    for json_text in (False, True):  # the depth read from the decoded value or from the text
        with pytest.raises(TooDeepError):
            decode_bounded(msgspec.json.decode, b"[" * 65 + b"]" * 65, field="$", json_text=json_text)
        assert decode_bounded(msgspec.json.decode, b"[" * 64 + b"]" * 64, field="$", json_text=json_text)


def test_toml_dotted_keys_deeper_than_the_limit_are_refused_before_decoding() -> None:
    check_toml_keys("$", ".".join(["a"] * 64) + " = 1")  # 63 dots: 64 levels
    with pytest.raises(TooDeepError):
        check_toml_keys("$", ".".join(["a"] * 65) + " = 1")
    with pytest.raises(TooDeepError):
        check_toml_keys("$", "[" + ".".join(['"q"'] * 3000) + "]")
    check_toml_keys("$", 'x = 1.5\n[a.b.c]\nd = "e.f.g"\n')


def test_size_and_text() -> None:
    check_size("f", "é" * 50, 100)
    with pytest.raises(TooLargeError):
        check_size("f", "é" * 51, 100)
    assert check_text("reason", "fine") == "fine"
    with pytest.raises(InvalidValueError) as info:
        check_text("reason", "forged\nline")
    assert info.value.code == "invalid_text"
    with pytest.raises(TooLargeError):
        check_text("reason", "x" * 1001)
