"""``<python> -m conduit_executors_python._inspect package.module:callable``: what ``conduit
config check`` runs in a binding's interpreter. It imports the callable as the runner does and
checks that msgspec can decode every parameter from its annotation and encode its return, then
prints one last line, ``conduit-check: {"code": …, "message": …}`` (code ``ok`` when fine)."""

from __future__ import annotations

import inspect
import sys
import typing

import msgspec

from conduit_executors_python import _runner

__all__ = ["main", "signature_problem"]

MARK = "conduit-check: "


def signature_problem(
    function: typing.Callable[..., typing.Any], hints: dict[str, typing.Any]
) -> str | None:
    """Why the runner could not call ``function`` with an input, or ``None``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError) as exc:
        return f"its signature cannot be read: {exc}"
    for name, p in parameters.items():
        if p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            return f"parameter {name!r} is positional-only; inputs are passed by name"
        if p.kind is p.VAR_POSITIONAL:
            continue
        annotation = hints.get(name, typing.Any)
        try:
            msgspec.json.Decoder(annotation)
        except TypeError as exc:
            return f"parameter {name!r}: msgspec cannot decode its annotation {annotation!r}: {exc}"
    returns = hints.get("return", typing.Any)
    try:
        msgspec.json.Decoder(returns)
    except TypeError as exc:
        return f"the return annotation {returns!r} cannot be checked by msgspec: {exc}"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m conduit_executors_python._inspect package.module:callable",
              file=sys.stderr)  # fmt: skip
        return 2
    report = _check(argv[0])
    sys.stdout.flush()
    sys.stdout.write("\n" + MARK + msgspec.json.encode(report).decode() + "\n")
    sys.stdout.flush()
    return 0


def _check(ref: str) -> dict[str, str]:
    try:
        function = _runner._load(ref)
    except _runner._Refused as exc:
        return {"code": "function_not_importable", "message": exc.message}
    try:
        problem = signature_problem(function, _runner._hints(function))
    except _runner._Refused as exc:
        problem = exc.message.removeprefix("$.function: ")
    if problem is None:
        return {"code": "ok", "message": ""}
    return {"code": "function_signature", "message": f"$.function: {ref!r}: {problem}"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
