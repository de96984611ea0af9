"""Test-only switches work only where the test plugin is installed; a production install refuses.

The production install is real: the shipped wheels of conduit-core and conduit-executors-shell,
built from this tree, installed into a fresh venv whose other packages are the test venv's
third-party ones (linked, so no network is needed), and no other conduit distribution: no test
plugin, no example. Its ``conduit daemon``, CLI direct mode, ``doctor`` and library store all
refuse to start with a switch variable set, naming it; the same daemon starts without one. In
the test venv (the plugin installed) the daemon obeys the switch and logs it, and ``doctor`` lists
it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
from importlib.metadata import distributions
from pathlib import Path

import pytest

from conduit_core.extension import SWITCH_VARIABLES
from tests.daemon.conftest import Daemon, wait_for

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("conduit_core", "conduit_executors_shell")
REFUSAL = "test_switch_without_test_plugin"
SWITCHES = {"CONDUIT_TEST_UNSAFE": "capacity_check", "CONDUIT_TEST_FAULT": "shell.after_spawn:kill"}


class _PlainDaemon(Daemon):
    """A daemon whose config uses only shipped executors (the suite's names a test one)."""

    def write_config(self, **settings: object) -> None:
        self.config.write_text(
            f'[settings]\nstore = "{self.store}"\ndata_dir = "{self.data}"\n'
            f'http.listen = "127.0.0.1:{self.port}"\n\n'
            f"[bindings.ok]\nexecutor = \"shell\"\nconfig = {{ command = 'echo hello' }}\n"
        )


def _conduit_entries(site: Path) -> set[str]:
    """Top-level names in ``site`` that belong to a conduit distribution (all editable here)."""
    names: set[str] = set()
    for dist in distributions(path=[str(site)]):
        if dist.metadata["Name"].lower().startswith("conduit"):
            names.update(Path(str(f)).parts[0] for f in dist.files or ())
    return names


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the shipped wheels and no test plugin; its ``python``."""
    root = tmp_path_factory.mktemp("production")
    wheels = root / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), *(str(REPO / d) for d in SHIPPED)],
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip
    venv = root / "venv"
    subprocess.run(
        [sys._base_executable, "-m", "venv", "--without-pip", str(venv)],  # type: ignore[attr-defined]
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True, timeout=30,
        ).stdout.strip()
    )  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--target", str(site), *map(str, wheels.glob("*.whl"))],
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip
    # The third-party dependencies: the test venv's, linked; every conduit distribution left out.
    ours = Path(sysconfig.get_paths()["purelib"])
    skip = _conduit_entries(ours)
    for entry in ours.iterdir():
        if entry.name not in skip and not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    probe = subprocess.run(
        [python, "-c",
         "import importlib.metadata as m, importlib.util as u, conduit_core;"
         "print(sorted(d.metadata['Name'] for d in m.distributions()"
         " if d.metadata['Name'].startswith('conduit')));"
         "print(len(m.entry_points(group='conduit.test_switches')), "
         "u.find_spec('conduit_test_plugin') is None, conduit_core.__file__)"],
        capture_output=True, text=True, timeout=60, cwd=root, env=_clean_env(),
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    dists, check = probe.stdout.splitlines()
    assert dists == "['conduit-core', 'conduit-executors-shell']", dists
    assert check == f"0 True {site}/conduit_core/__init__.py", check
    return python


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any switch, nor a path into the source tree."""
    env = {k: v for k, v in os.environ.items() if k not in SWITCH_VARIABLES and k != "PYTHONPATH"}
    return env | extra


def _conduit(
    python: Path, daemon: Daemon, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-m", "conduit_core.cli", *args, "--config", str(daemon.config)],
        capture_output=True, text=True, timeout=60, cwd=daemon.root, env=_clean_env(**env),
    )  # fmt: skip


def _assert_refused(proc: subprocess.CompletedProcess[str], variable: str) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"error [{REFUSAL}]: {variable} set" in proc.stderr, proc.stderr
    assert f"unset {variable}" in proc.stderr


def _start(python: Path, daemon: Daemon, **env: str) -> subprocess.Popen[bytes]:
    with daemon.log_path.open("ab") as log:
        daemon.proc = subprocess.Popen(
            [python, "-m", "conduit_core.cli", "daemon", "--config", str(daemon.config),
             "--rescan", "0.2"],
            stdout=log, stderr=subprocess.STDOUT, cwd=daemon.root, env=_clean_env(**env),
        )  # fmt: skip
    return daemon.proc


@pytest.mark.parametrize("variable", sorted(SWITCHES))
def test_a_production_daemon_refuses_to_start_with_a_test_switch(
    production: Path, tmp_path: Path, variable: str
) -> None:
    daemon = _PlainDaemon(tmp_path, str(tmp_path / "store.db"))
    proc = _start(production, daemon, **{variable: SWITCHES[variable]})
    try:
        assert proc.wait(timeout=60) == 1, daemon.log()
    finally:
        daemon.kill()
    assert f"error [{REFUSAL}]: {variable} set" in daemon.log(), daemon.log()
    assert not (daemon.data / "daemon.pid").exists()
    # Control: the very same install and config start without the variable.
    _start(production, daemon)
    try:
        wait_for("the production daemon to answer /v1/health", daemon._healthy, timeout=60)
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.wait_exit()
    assert "TEST SWITCHES ACTIVE" not in daemon.log()


def test_production_cli_direct_mode_doctor_and_library_refuse(
    production: Path, tmp_path: Path
) -> None:
    daemon = _PlainDaemon(tmp_path, str(tmp_path / "store.db"))
    both = {"CONDUIT_TEST_UNSAFE": "capacity_check", "CONDUIT_TEST_FAULT": "x:kill"}
    submit = ("work", "submit", "ok")
    _assert_refused(_conduit(production, daemon, *submit, CONDUIT_TEST_UNSAFE="capacity_lock"),
                    "CONDUIT_TEST_UNSAFE")  # fmt: skip
    assert not (tmp_path / "store.db").exists()  # refused before the store was even opened
    proc = _conduit(production, daemon, *submit, **both)
    _assert_refused(proc, "CONDUIT_TEST_UNSAFE, CONDUIT_TEST_FAULT")
    ok = _conduit(production, daemon, *submit)
    assert ok.returncode == 0, ok.stderr  # control: direct mode works without the variable

    doctor = _conduit(production, daemon, "doctor", CONDUIT_TEST_FAULT="shell.after_spawn:kill")
    assert doctor.returncode == 1, doctor.stdout
    assert f"fail test switches: [{REFUSAL}] CONDUIT_TEST_FAULT set" in " ".join(
        doctor.stdout.split()
    ), doctor.stdout
    clean = _conduit(production, daemon, "doctor", "--json")
    assert '"name": "test switches",\n    "status": "ok"' in clean.stdout, clean.stdout

    # Library use: the core alone never reports a protection off, and opening a store refuses.
    library = subprocess.run(
        [production, "-c",
         "from conduit_core.extension import protection_off\n"
         "from conduit_core.storage import open_store_sync\n"
         "from conduit_core.errors import ConduitError\n"
         "print(protection_off('capacity_check'), protection_off('capacity_lock'))\n"
         f"try:\n    open_store_sync({str(tmp_path / 'lib.db')!r})\n"
         "except ConduitError as exc:\n    print(exc.code)\n"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env=_clean_env(CONDUIT_TEST_UNSAFE="capacity_check,capacity_lock"),
    )  # fmt: skip
    assert library.stdout.split() == ["False", "False", REFUSAL], library.stdout + library.stderr
    assert not (tmp_path / "lib.db").exists()


def test_with_the_test_plugin_the_daemon_obeys_and_says_so(tmp_path: Path) -> None:
    daemon = _PlainDaemon(tmp_path, str(tmp_path / "store.db"))
    python = Path(sys.executable)
    _start(python, daemon, CONDUIT_TEST_UNSAFE="capacity_check")
    try:
        wait_for("the test daemon to answer /v1/health", daemon._healthy, timeout=60)
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.wait_exit()
    assert (
        "TEST SWITCHES ACTIVE (never in production): CONDUIT_TEST_UNSAFE=capacity_check, "
        "provided by test-plugin (conduit-test-plugin)" in daemon.log()
    ), daemon.log()
    doctor = _conduit(python, daemon, "doctor", CONDUIT_TEST_UNSAFE="capacity_check")
    text = " ".join(doctor.stdout.split())
    assert (
        "warn test switches: active: CONDUIT_TEST_UNSAFE=capacity_check (provided by "
        "test-plugin (conduit-test-plugin))" in text
    ), doctor.stdout
    unknown = _conduit(python, daemon, "work", "list", CONDUIT_TEST_UNSAFE="capacity_chek")
    assert unknown.returncode == 1
    assert (
        "error [test_switch_unknown]: CONDUIT_TEST_UNSAFE names unknown protection(s) "
        "capacity_chek" in unknown.stderr
    ), unknown.stderr
