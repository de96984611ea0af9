"""One set of rules for what enters conduit, whichever door it comes through.

HTTP bodies, CLI direct mode, ``conduit.toml``, Routines, manifests and job result files all use
these checks, so an id refused over HTTP is refused when the CLI writes the store directly, and a
number the config refuses is never stored by a Routine. Every refusal is an
:class:`InvalidValueError` (a :class:`ConduitError`) with a stable ``code`` and a ``field`` path,
raised before anything is written.

The limits are constants so the docs, the OpenAPI document and the tests state the same numbers.
Patterns are written to mean the same in Python's ``re`` and in JSON Schema (ECMA-262): ``$``
alone lets a trailing newline through in Python, so each pattern ends ``(?!\\n)$``.
"""

from __future__ import annotations

import math
import re
import zoneinfo
from array import array
from collections.abc import Callable, Mapping
from itertools import accumulate
from typing import Annotated, Any, Final, TypeVar

import msgspec

from conduit_core.errors import ConduitError

__all__ = [
    "AMOUNT_CEILING",
    "KEY_MAX_LENGTH",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "ID_MAX_LENGTH",
    "MAX_AMOUNT",
    "MAX_BODY_BYTES",
    "MAX_DEPTH",
    "MAX_THEN_STEPS",
    "MAX_DOCUMENT_BYTES",
    "MAX_PAYLOAD_BYTES",
    "MAX_SECONDS",
    "MAX_TEXT_LENGTH",
    "NAME_PATTERN",
    "ROUTINE_ID_PATTERN",
    "TIMEZONE_MAX_LENGTH",
    "WORK_ID_PATTERN",
    "Amount",
    "Count",
    "DURATION_PATTERN",
    "Duration",
    "InvalidIdError",
    "InvalidNumberError",
    "InvalidValueError",
    "NameStr",
    "Priority",
    "Seconds",
    "TooDeepError",
    "TooLargeError",
    "WorkIdStr",
    "check_depth",
    "check_json_depth",
    "check_name",
    "check_payload",
    "check_size",
    "check_text",
    "check_timezone",
    "check_toml_keys",
    "check_work_id",
    "concurrency_key_fields",
    "decode_bounded",
    "decode_toml",
    "duration_ms",
    "key_template_fields",
    "render_key_template",
    "finite_number",
    "render_concurrency_key",
    "saturating_add",
]

T = TypeVar("T")

#: Longest Work id, binding, scope, routine, budget or event-type name.
ID_MAX_LENGTH: Final = 128
#: Work ids: a letter or digit, then letters, digits, ``_ . : -``. No ``/``, space, NUL or
#: control character, so an id can never name a path outside the place it is used.
WORK_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}(?!\n)$"
#: Binding, scope, routine and budget names: as Work ids without ``:``.
NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}(?!\n)$"
#: Routine ids: as names, at most 100 characters, so the id of the Work a fire creates
#: (``routine:<id>:<scheduled ms>``) stays within :data:`ID_MAX_LENGTH`.
#: Steps a Routine's fire may chain after its first Work (``then``): the step's Work id is the
#: fire key plus ``.<n>`` (one digit), which keeps it within the Work id grammar's length.
MAX_THEN_STEPS: Final = 8
ROUTINE_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}(?!\n)$"
#: Deepest nesting of arrays/objects/tables in any JSON, TOML or msgpack document.
MAX_DEPTH: Final = 64
#: Largest config file, manifest or job result file.
MAX_DOCUMENT_BYTES: Final = 1024 * 1024
#: Largest single input payload (encoded as JSON).
MAX_PAYLOAD_BYTES: Final = 1024 * 1024
#: Largest HTTP request body (a payload plus its envelope).
MAX_BODY_BYTES: Final = 2 * 1024 * 1024
#: Longest free-text field (a reason, a description).
MAX_TEXT_LENGTH: Final = 1000
#: Longest duration or delay: ten years. Any instant plus this stays a valid datetime for
#: millennia, so timer and lease arithmetic cannot overflow.
MAX_SECONDS: Final = 10 * 366 * 86400.0
#: Largest usage amount one result may report for one unit.
MAX_AMOUNT: Final = 1e15
#: A budget ledger saturates here instead of overflowing to infinity (or to ``null`` in JSON).
AMOUNT_CEILING: Final = 1e300
#: IANA names are far shorter; the bound keeps a 300-character name away from the filesystem.
TIMEZONE_MAX_LENGTH: Final = 64

_WORK_ID = re.compile(WORK_ID_PATTERN)
_NAME = re.compile(NAME_PATTERN)
_TIMEZONE = re.compile(r"^[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*$")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a tab is fine; a newline forges log lines
# A dotted TOML key of many parts nests tables; tomllib takes quadratic time over it, so such a
# key is refused from the raw text before decoding (a string value that merely contains a long
# dotted run is refused too: a false refusal of an odd value beats a hung loader).
_TOML_SEGMENT = r"""(?:[A-Za-z0-9_-]++|"[^"\n]*+"|'[^'\n]*+')"""
_TOML_DEEP_KEY = re.compile(
    rf"(?<![A-Za-z0-9_-]){_TOML_SEGMENT}(?:[ \t]*\.[ \t]*{_TOML_SEGMENT}){{{MAX_DEPTH}}}"
)

#: The range of a Work's or a binding's ``priority`` (higher starts first; 0 is the default).
PRIORITY_MIN: Final = -10
PRIORITY_MAX: Final = 10
#: Longest rendered concurrency key.
KEY_MAX_LENGTH: Final = 256
Priority = Annotated[int, msgspec.Meta(ge=PRIORITY_MIN, le=PRIORITY_MAX)]

_KEY_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def concurrency_key_fields(template: str, field: str) -> list[str]:
    """The input fields a ``concurrency_key`` template names (``"{customer}"``), in order;
    ``InvalidValueError`` (``invalid_concurrency_key``) for a brace that is not ``{name}`` or
    a template outside the bounds of a key."""
    rest = _KEY_FIELD.sub("", template)
    if "{" in rest or "}" in rest:
        raise InvalidValueError(
            field, f"{template!r}: write each input field as {{name}} (letters, digits, _)",
            code="invalid_concurrency_key",
        )
    if not template or len(template) > KEY_MAX_LENGTH or _CONTROL.search(template):
        raise InvalidValueError(
            field, f"a key template has 1 to {KEY_MAX_LENGTH} printable characters",
            code="invalid_concurrency_key",
        )
    return _KEY_FIELD.findall(template)


def render_concurrency_key(template: str, payload: Any) -> str:
    """The key ``template`` names for a Work whose first input is ``payload``: each ``{name}``
    replaced by the input's top-level field ``name`` (a string, an integer or a boolean).

    Refused with a ``ConduitError`` naming the field: ``concurrency_key_field_missing`` when
    the input is not an object or lacks it, ``invalid_concurrency_key`` when its value is of
    another type or the key comes out longer than :data:`KEY_MAX_LENGTH`."""
    names = concurrency_key_fields(template, "concurrency_key")

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if not isinstance(payload, dict) or name not in payload:
            raise ConduitError(
                f"$.input.{name}: the binding's concurrency_key {template!r} needs field "
                f"{name!r} of the first input",
                code="concurrency_key_field_missing",
            )
        found = payload[name]
        if isinstance(found, bool):
            return "true" if found else "false"
        if isinstance(found, str | int):
            return str(found)
        raise ConduitError(
            f"$.input.{name}: a concurrency key field is a string, an integer or a boolean, "
            f"not {type(found).__name__}",
            code="invalid_concurrency_key",
        )

    key = _KEY_FIELD.sub(value, template) if names else template
    if len(key) > KEY_MAX_LENGTH:
        raise ConduitError(
            f"$.input: the concurrency key is {len(key)} characters, at most {KEY_MAX_LENGTH}",
            code="invalid_concurrency_key",
        )
    return key


#: For msgspec Structs: a Work id, a name, a bounded duration, a bounded usage amount, a count.
WorkIdStr = Annotated[str, msgspec.Meta(pattern=WORK_ID_PATTERN)]
NameStr = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
Amount = Annotated[float, msgspec.Meta(ge=0, le=MAX_AMOUNT)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]

#: A span written for people: ``500ms``, ``5s``, ``10m``, ``2h``, ``1d`` (dedup windows,
#: debounce quiet periods and maximum waits); :func:`duration_ms` reads it.
DURATION_PATTERN: Final = r"^[0-9]{1,9}(ms|s|m|h|d)(?!\n)$"
Duration = Annotated[str, msgspec.Meta(pattern=DURATION_PATTERN, max_length=11)]
_DURATION_UNIT_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str, field: str = "duration") -> int:
    """Milliseconds of a :data:`Duration` (``invalid_duration`` naming ``field`` otherwise)."""
    found = re.fullmatch(r"([0-9]{1,9})(ms|s|m|h|d)", text)
    if found is None:
        raise InvalidValueError(
            field, f"{text!r} is not a duration like 500ms, 5s, 10m, 2h or 1d",
            code="invalid_duration",
        )  # fmt: skip
    return int(found[1]) * _DURATION_UNIT_MS[found[2]]


_TEMPLATE_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def key_template_fields(template: str, field: str) -> list[str]:
    """The input fields a key template names (``"order-{order_id}"``: ``["order_id"]``), or
    ``invalid_key_template`` naming ``field``. ``{{``/``}}`` write a brace; ``{a.b}`` reads a
    nested field; nothing else (no format specs, no indexing) is allowed."""
    import string

    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise InvalidValueError(field, f"{template!r}: {exc}", code="invalid_key_template") from exc
    names: list[str] = []
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if spec or conversion or not _TEMPLATE_FIELD.fullmatch(name):
            raise InvalidValueError(
                field, f"{template!r}: {{{name}}} is not a field name like {{order_id}} or "
                "{customer.id}", code="invalid_key_template",
            )  # fmt: skip
        names.append(name)
    return names


def render_key_template(template: str, payload: Any, field: str) -> str:
    """The key ``template`` makes of a first input ``payload`` (an object whose named fields
    are strings, numbers or booleans); ``key_field_missing`` names the field it lacks."""
    values: dict[str, str] = {}
    for name in key_template_fields(template, field):
        value: Any = payload
        for part in name.split("."):
            if not isinstance(value, dict) or part not in value:
                raise InvalidValueError(
                    field, f"the template {template!r} reads {name!r}, which the input has not",
                    code="key_field_missing",
                )  # fmt: skip
            value = value[part]
        if isinstance(value, dict | list) or value is None:
            raise InvalidValueError(
                field, f"the template {template!r} reads {name!r}, which is not a string or "
                "number in the input", code="key_field_missing",
            )  # fmt: skip
        values[name] = str(value).lower() if isinstance(value, bool) else str(value)
    import string

    key = "".join(literal + (values[name] if name is not None else "")
                  for literal, name, _, _ in string.Formatter().parse(template))  # fmt: skip
    if not key or len(key) > ID_MAX_LENGTH:
        raise InvalidValueError(
            field, f"the key made of {template!r} must have 1 to {ID_MAX_LENGTH} characters",
            code="invalid_key",
        )  # fmt: skip
    return key


class InvalidValueError(ConduitError):
    """A value refused at a boundary; ``field`` is its path (``$.settings.lease_seconds``)."""

    code = "invalid_value"

    def __init__(self, field: str, message: str, *, code: str | None = None) -> None:
        super().__init__(f"{field}: {message}", code=code)
        self.field = field


class InvalidIdError(InvalidValueError):
    """A Work id or a name outside the documented grammar."""

    code = "invalid_id"


class InvalidNumberError(InvalidValueError):
    """A number that is not finite, or outside its documented bounds."""

    code = "invalid_number"


class TooDeepError(InvalidValueError):
    """A document nested deeper than :data:`MAX_DEPTH`."""

    code = "too_deep"


class TooLargeError(InvalidValueError):
    """A document or value larger than its limit."""

    code = "too_large"


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "…")


def check_work_id(value: object, field: str = "id") -> str:
    """``value`` if it is a valid Work id, else :class:`InvalidIdError`."""
    return _check_grammar(value, field, _WORK_ID, "Work id", extra=" ':'")


def check_name(value: object, field: str, kind: str = "name") -> str:
    """``value`` if a valid binding, scope, routine or budget name; else :class:`InvalidIdError`."""
    return _check_grammar(value, field, _NAME, kind, extra="")


def _check_grammar(
    value: object, field: str, pattern: re.Pattern[str], kind: str, extra: str
) -> str:
    if not isinstance(value, str):
        raise InvalidIdError(field, f"a {kind} must be a string, not {type(value).__name__}")
    if len(value) > ID_MAX_LENGTH:
        raise InvalidIdError(
            field, f"{kind} {_shown(value)} is longer than {ID_MAX_LENGTH} characters"
        )
    if not pattern.match(value):
        raise InvalidIdError(
            field,
            f"{kind} {_shown(value)} must start with a letter or digit and use only letters, "
            f"digits, '_', '.', '-'{extra and ','}{extra} (at most {ID_MAX_LENGTH} characters)",
        )
    return value


def finite_number(
    field: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    positive: bool = False,
) -> float:
    """``value`` as a finite float within bounds (``positive``: strictly above ``minimum``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidNumberError(field, f"expected a number, not {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        raise InvalidNumberError(field, "the number is too large") from None
    if not math.isfinite(number):
        raise InvalidNumberError(field, f"must be a finite number, not {value!r}")
    if minimum is not None and (number <= minimum if positive else number < minimum):
        relation = ">" if positive else ">="
        raise InvalidNumberError(field, f"must be {relation} {minimum:g}, not {number:g}")
    if maximum is not None and number > maximum:
        raise InvalidNumberError(field, f"must be <= {maximum:g}, not {number:g}")
    return number


def saturating_add(a: float, b: float) -> float:
    """``a + b`` for ledger amounts, never past :data:`AMOUNT_CEILING` nor below 0.

    A stored amount that is not a finite number (an old overflow) counts as the ceiling: an
    exhausted budget refuses its own Work, and nothing else stops.
    """
    a = a if math.isfinite(a) else AMOUNT_CEILING
    b = b if math.isfinite(b) else AMOUNT_CEILING
    return min(max(a, 0.0) + max(b, 0.0), AMOUNT_CEILING)


def check_text(field: str, value: str, *, max_length: int = MAX_TEXT_LENGTH) -> str:
    """One line of free text: at most ``max_length`` characters, no control characters."""
    if len(value) > max_length:
        raise TooLargeError(field, f"at most {max_length} characters")
    if _CONTROL.search(value):
        raise InvalidValueError(field, "must not contain control characters", code="invalid_text")
    return value


def check_timezone(field: str, name: object) -> zoneinfo.ZoneInfo:
    """The IANA zone ``name``; ``invalid_timezone`` for anything else (never a file path)."""
    if not isinstance(name, str):
        raise InvalidValueError(field, "a timezone is a string", code="invalid_timezone")
    if len(name) > TIMEZONE_MAX_LENGTH or not _TIMEZONE.match(name) or ".." in name:
        raise InvalidValueError(
            field, f"{_shown(name)} is not an IANA timezone name", code="invalid_timezone"
        )
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a tzdata *directory* such as "America"; its path is not the user's business.
        raise InvalidValueError(
            field, f"unknown timezone {name!r}", code="invalid_timezone"
        ) from None


def check_size(field: str, raw: bytes | str, max_bytes: int) -> None:
    """:class:`TooLargeError` when ``raw`` is larger than ``max_bytes``."""
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise TooLargeError(field, f"larger than {max_bytes} bytes ({size} bytes)")


def check_depth(value: object, field: str = "$", max_depth: int = MAX_DEPTH) -> None:
    """:class:`TooDeepError` when ``value`` nests lists/dicts/Structs deeper than ``max_depth``.

    Iterative, so it is safe on any value however it was built.
    """
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        elif isinstance(item, msgspec.Struct):
            children = [getattr(item, name) for name in item.__struct_fields__]
        else:
            continue
        if depth >= max_depth:
            raise TooDeepError(field, f"nested deeper than {max_depth} levels")
        stack.extend((child, depth + 1) for child in children)


#: A JSON string, escapes included (only valid JSON is scanned: no raw newline can be in one).
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
#: Every byte but a bracket, deleted by ``bytes.translate``.
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
#: An opening bracket as +1, a closing one as -1 (read as signed bytes).
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def check_json_depth(raw: bytes, field: str = "$", max_depth: int = MAX_DEPTH) -> None:
    """:class:`TooDeepError` when the valid JSON text ``raw`` nests arrays/objects deeper than
    ``max_depth``: the same verdict as :func:`check_depth` on what it decodes to (a decoder
    keeps the nesting), from the text, with no walk over the decoded values: a bulk submit of
    128 Work took ~1 ms of the event loop's time walked, ~45 µs read from its text."""
    # Outside its strings: with no escape in the text, every other piece between quotes.
    outside = b"".join(raw.split(b'"')[::2]) if b"\\" not in raw else _JSON_STRING.sub(b"", raw)
    brackets = outside.translate(None, _NOT_BRACKETS)
    if brackets.count(b"[") + brackets.count(b"{") <= max_depth:
        return  # fewer containers than the limit cannot nest past it
    steps = array("b", brackets.translate(_BRACKET_STEPS))
    if max(accumulate(steps)) > max_depth:
        raise TooDeepError(field, f"nested deeper than {max_depth} levels")


def check_payload(field: str, value: object, max_bytes: int = MAX_PAYLOAD_BYTES) -> None:
    """An input payload within the depth and size limits (size as encoded JSON)."""
    check_depth(value, field)
    try:
        size = len(msgspec.json.encode(value))
    except (TypeError, ValueError) as exc:
        raise InvalidValueError(field, f"not JSON-encodable: {exc}", code="invalid_json") from None
    if size > max_bytes:
        raise TooLargeError(field, f"larger than {max_bytes} bytes as JSON ({size} bytes)")


def check_toml_keys(field: str, text: str) -> None:
    """Refuse a dotted TOML key of more than :data:`MAX_DEPTH` parts before it is decoded."""
    if _TOML_DEEP_KEY.search(text):
        raise TooDeepError(field, f"a dotted key nests deeper than {MAX_DEPTH} levels")


def decode_bounded(
    decode: Callable[[bytes], T],
    raw: bytes,
    *,
    field: str,
    max_bytes: int = MAX_DOCUMENT_BYTES,
    max_depth: int = MAX_DEPTH,
    json_text: bool = False,
) -> T:
    """``decode(raw)`` within the size and depth limits (``json_text``: ``raw`` is JSON, its
    depth read from the text, not by walking what it decoded to).

    The decoder's own errors (``msgspec.DecodeError``, ``ValidationError``) pass through for the
    caller to word; running out of stack on a deep document becomes :class:`TooDeepError`.
    """
    check_size(field, raw, max_bytes)
    try:
        value = decode(raw)
    except RecursionError:
        raise TooDeepError(field, f"nested deeper than {max_depth} levels") from None
    if json_text:
        check_json_depth(raw, field, max_depth)
    else:
        check_depth(value, field, max_depth)
    return value


def decode_toml(raw: bytes, *, field: str = "$", type: Any = Any) -> Any:
    """A TOML document (config, manifest) within the size, key-depth and nesting limits.

    ``msgspec.DecodeError`` / ``ValidationError`` pass through for the caller to word.
    """
    check_size(field, raw, MAX_DOCUMENT_BYTES)
    # Key depth before decoding: tomllib takes quadratic time over a long dotted key.
    check_toml_keys(field, raw.decode("utf-8", "replace"))
    value = decode_bounded(msgspec.toml.decode, raw, field=field)
    # Typed only after the depth check, so a deep value is too_deep whatever its field's type.
    return value if type is Any else msgspec.convert(value, type)
