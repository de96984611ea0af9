"""Binding config decoding and naming (no engine needed)."""

from __future__ import annotations

import pytest

from conduit_core.extension import OperationError
from conduit_executors_container import container_name, decode_config


def test_defaults_are_safe() -> None:
    config = decode_config({"image": "busybox"})
    assert config.network == "none"
    assert config.pull == "never"
    assert config.argv() is None
    assert decode_config({"image": "x", "command": "echo hi"}).argv() == [
        "/bin/sh",
        "-c",
        "echo hi",
    ]
    assert decode_config({"image": "x", "stop_signal": "int"}).signal_name() == "SIGINT"
    assert decode_config({"image": "x", "stop_grace_seconds": 0.2}).grace_seconds() == 1


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"image": "x", "bogus": 1}, "unknown field `bogus`"),
        ({}, "missing required field `image`"),
        ({"image": "x", "mounts": [{"source": "rel", "target": "/d"}]}, "$.mounts[0].source"),
        ({"image": "x", "mounts": [{"source": "/a/../etc", "target": "/d"}]}, "$.mounts[0].source"),
        ({"image": "x", "mounts": [{"source": "/a", "target": "/conduit"}]}, "$.mounts[0].target"),
        ({"image": "x", "mounts": [{"source": "/a", "target": "/d", "mode": "rw"}]}, "$.mounts[0]"),
        ({"image": "x", "network": "container:abc"}, "$.network"),
        ({"image": "x", "memory": "lots"}, "$.memory"),
        ({"image": "x", "pull": "always"}, "$.pull"),
        ({"image": "x", "stop_signal": "SIGNOPE"}, "$.stop_signal"),
        ({"image": "x", "timeout_seconds": 0}, "$.timeout_seconds"),
        ({"image": "x", "command": []}, "$.command"),
        # Issue 17: these spell the result directory or the root and reached the engine.
        ({"image": "x", "mounts": [{"source": "/a", "target": "//conduit"}]}, "$.mounts[0].target"),
        (
            {"image": "x", "mounts": [{"source": "/a", "target": "/./conduit"}]},
            "$.mounts[0].target",
        ),
        ({"image": "x", "mounts": [{"source": "/a", "target": "/."}]}, "$.mounts[0].target"),
        ({"image": "x", "mounts": [{"source": "/a", "target": "//"}]}, "$.mounts[0].target"),
        ({"image": "x", "stop_grace_seconds": float("inf")}, "$.stop_grace_seconds"),
        ({"image": "x", "timeout_seconds": float("nan")}, "$.timeout_seconds"),
    ],
)
def test_invalid_config_is_permanent_and_names_the_path(raw: dict[str, object], path: str) -> None:
    with pytest.raises(OperationError) as caught:
        decode_config(raw)
    assert caught.value.code == "invalid_config"
    assert caught.value.permanent
    assert path in caught.value.message


def test_names_are_deterministic_safe_and_distinct() -> None:
    assert container_name("abc-123", 2) == "conduit-abc-123-2"
    odd = container_name("a/b c", 1)
    assert odd.startswith("conduit-a_b_c_")
    assert odd != container_name("a_b_c", 1)
    assert len(container_name("x" * 500, 1)) < 130
    # An id that spells another id's digested name keeps a name of its own.
    mimic = odd.removeprefix("conduit-").removesuffix("-1")
    assert container_name(mimic, 1) != odd


def test_a_mount_target_beside_the_result_directory_is_accepted() -> None:
    # The negative control for the refusals above: only the result directory and root are kept.
    config = decode_config({"image": "x", "mounts": [{"source": "/a", "target": "/conduit-data"}]})
    assert config.mounts[0].target == "/conduit-data"
