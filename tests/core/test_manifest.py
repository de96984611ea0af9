"""Manifest decoding, validation and the JSON Schema kept in manifests/."""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit_core.errors import ManifestError
from conduit_core.extension import Capability, decode_manifest
from conduit_core.extension.schema import render

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "manifests" / "manifest.schema.json"


def test_manifest_decodes() -> None:
    manifest = decode_manifest(
        'schema = 1\npackage = "p"\n[[executors]]\nname = "x"\ngeneration = 3\n'
        'historical_generations = [1, 2]\npool = "jobs"\ncapabilities = ["stop"]\n'
        '[[gates]]\nname = "g"\n',
        source="m.toml",
    )
    ex = manifest.executors[0]
    assert ex.generations() == (3, 1, 2)
    assert ex.pool == "jobs"
    assert ex.capabilities == [Capability.STOP]
    assert manifest.gates[0].name == "g"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ('schema = 2\npackage = "p"\n', "$.schema: manifest schema 2 is not supported"),
        ('package = "p"\n', "missing required field `schema`"),
        (
            'schema = 1\npackage = "p"\n[[executors]]\nname = "x"\ngeneration = 0\n',
            "Expected `int` >= 1 - at `$.executors[0].generation`",
        ),
        (
            'schema = 1\npackage = "p"\n[[executors]]\nname = "x"\ngeneration = 1\n'
            'capabilities = ["fly"]\n',
            "at `$.executors[0].capabilities[0]`",
        ),
        (
            'schema = 1\npackage = "p"\n[[executors]]\nname = "x"\ngeneration = 1\n'
            '[[executors]]\nname = "x"\ngeneration = 1\n',
            "$.executors[1].name: 'x' is declared twice",
        ),
        (
            'schema = 1\npackage = "p"\n[[executors]]\nname = "x"\ngeneration = 2\n'
            "historical_generations = [2]\n",
            "repeats a generation",
        ),
        ('schema = 1\npackage = "p"\nextra = 1\n', "unknown field `extra`"),
        ("schema = [\n", "not valid TOML"),
    ],
)
def test_bad_manifest_names_source_and_field(doc: str, expected: str) -> None:
    with pytest.raises(ManifestError) as caught:
        decode_manifest(doc, source="pkg/conduit-manifest.toml")
    assert caught.value.code == "invalid_manifest"
    assert caught.value.message.startswith("pkg/conduit-manifest.toml: ")
    assert expected in caught.value.message


def test_json_schema_in_manifests_folder_is_in_sync() -> None:
    current = render()
    assert SCHEMA_FILE.read_text() == current, (
        "manifests/manifest.schema.json is stale; regenerate it with "
        "`python -m conduit_core.extension.schema > manifests/manifest.schema.json`"
    )


@pytest.mark.parametrize(
    "doc",
    [
        'schema = 1\npackage = "x"\nextra = ' + "[" * 3000 + "]" * 3000,
        ".".join(["a"] * 3000) + " = 1",
        'schema = 1\npackage = "x"\n[[executors]]\nname = "e"\ndescription = { a = '
        + "{ b = " * 70
        + "1"
        + " }" * 70
        + " }\n",
    ],
    ids=["arrays", "dotted-key", "inline-tables"],
)
def test_a_deeply_nested_manifest_is_a_coded_error_not_a_recursion_error(doc: str) -> None:
    # Was: RecursionError out of the TOML decoder (issue 17, item 6).
    with pytest.raises(ManifestError) as info:
        decode_manifest(doc, source="deep.toml")
    assert info.value.code == "too_deep"
    assert info.value.message.startswith("deep.toml: $")
