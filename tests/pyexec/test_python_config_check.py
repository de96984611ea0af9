"""``conduit config check`` imports a python binding's function in the binding's interpreter (with
its cwd and env) and checks its signature; daemon start does not run user code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conduit_core.config import check_against_plugins, parse_config
from conduit_core.plugins import Plugins
from tests.pyexec._config import REPO

CONFIG = """
[settings]
store = "{root}/conduit.db"

[bindings.{name}]
executor = "python"
config = {{ function = "{function}", {more} }}
"""

ON_PATH = f'env = {{ PYTHONPATH = "{REPO}" }}'


def _check(tmp_path: Path, function: str, more: str = ON_PATH, name: str = "job") -> tuple[int, str]:
    path = tmp_path / "conduit.toml"
    path.write_text(CONFIG.format(root=tmp_path, name=name, function=function, more=more))
    done = subprocess.run(
        [sys.executable, "-m", "conduit_core.cli", "config", "check", str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_an_importable_function_with_a_decodable_signature_passes(tmp_path: Path) -> None:
    status, out = _check(tmp_path, "tests.pyexec.funcs:area", f'mode = "warm", {ON_PATH}')
    assert status == 0, out
    assert out.startswith("ok: ")


@pytest.mark.parametrize(
    ("function", "code", "says"),
    [
        ("tests.pyexec.nowhere:f", "function_not_importable",
         "$.function: cannot import 'tests.pyexec.nowhere:f': ModuleNotFoundError"),
        ("tests.pyexec.funcs:missing", "function_not_importable",
         "has no attribute 'missing'"),
        ("tests.pyexec.funcs:undecodable", "function_signature",
         "$.function: 'tests.pyexec.funcs:undecodable': parameter 'lock': msgspec cannot decode"),
        ("tests.pyexec.funcs:positional", "function_signature",
         "parameter 'n' is positional-only; inputs are passed by name"),
    ],
)  # fmt: skip
def test_a_bad_function_is_refused_with_a_code_naming_the_binding(
    tmp_path: Path, function: str, code: str, says: str
) -> None:
    status, out = _check(tmp_path, function, name="orders")
    assert status != 0
    assert f"error [{code}]:" in out, out
    assert "$.bindings.orders.config: " in out, out
    assert says in out, out


def test_the_binding_cwd_and_env_apply_to_the_import(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "shop.py").write_text(
        "import os\nif os.environ.get('SHOP') != 'open':\n    raise RuntimeError('closed')\n"
        "def sell(n: int) -> int:\n    return n\n"
    )
    status, out = _check(tmp_path, "shop:sell", f'cwd = "{code}", env = {{ SHOP = "open" }}')
    assert status == 0, out
    status, out = _check(tmp_path, "shop:sell", f'cwd = "{code}"')
    assert "error [function_not_importable]:" in out
    assert "RuntimeError: closed" in out
    status, out = _check(tmp_path, "shop:sell", 'env = { SHOP = "open" }')
    assert "ModuleNotFoundError: No module named 'shop'" in out


def test_daemon_start_checks_do_not_import_the_function(tmp_path: Path) -> None:
    table = CONFIG.format(
        root=tmp_path, name="job", function="tests.pyexec.nowhere:f", more=ON_PATH
    )
    check_against_plugins(parse_config(table), Plugins.load())  # nothing raised
