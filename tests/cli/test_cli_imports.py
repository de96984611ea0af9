"""The ``conduit`` entry point answers at once: the heavy layers load only in the commands that
use them (the figures are in bench/bench_cli.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conduit_core.cli._choices import MISFIRE_POLICIES, WORK_KINDS, WORK_STATUSES
from conduit_core.model import MisfirePolicy, WorkKind, WorkStatus

#: Top-level packages and conduit_core layers no ``--help`` may load.
HEAVY = (
    "conduit_core.daemon",
    "conduit_core.http",
    "conduit_core.runtime",
    "conduit_core.storage",
    "conduit_core.console",
    "conduit_core.routines",
    "conduit_core.config",
    "conduit_core.plugins",
    "conduit_core.remote",
    "conduit_core.model",
    "starlette",
    "uvicorn",
    "psycopg",
    "docker",
    "jinja2",
    "prometheus_client",
    "rich",
)
#: Loaded by most subcommands (the root group refuses test switches no plugin provides when one
#: is set; the store and the daemon look their providers up), but not by the entry point's
#: import nor by ``conduit --help``.
CONTRACT = ("conduit_core.extension", "anyio", "pluggy")

_PROBE = """
import json, sys
{run}
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(run: str) -> list[str]:
    """The modules a fresh interpreter holds after ``run`` (stdout: their JSON list)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(run=run)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    return modules


def _heavy(modules: list[str], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in heavy)]


def _help(args: list[str]) -> str:
    run = (
        "import io, contextlib\n"
        "from conduit_core.cli import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    cli({args!r}, prog_name='conduit', standalone_mode=False)\n"
    )
    return run


def test_importing_the_entry_point_loads_no_heavy_layer() -> None:
    assert _heavy(_loaded("from conduit_core.cli import main"), HEAVY + CONTRACT) == []


def test_help_loads_no_heavy_layer() -> None:
    assert _heavy(_loaded(_help(["--help"])), HEAVY + CONTRACT) == []


@pytest.mark.parametrize("group", ["work", "routines", "config", "plugins", "daemon", "doctor"])
def test_subcommand_help_loads_no_heavy_layer(group: str) -> None:
    assert _heavy(_loaded(_help([group, "--help"]))) == []


def test_the_probe_sees_a_heavy_import() -> None:
    # Negative control: the same probe reports the daemon once a command needs it.
    assert "conduit_core.daemon" in _heavy(_loaded("import conduit_core.cli._daemon, "
                                                   "conduit_core.daemon"))  # fmt: skip


def test_the_offered_choices_are_the_models_values() -> None:
    assert tuple(k.value for k in WorkKind) == WORK_KINDS
    assert tuple(s.value for s in WorkStatus) == WORK_STATUSES
    assert tuple(m.value for m in MisfirePolicy) == MISFIRE_POLICIES


@pytest.mark.parametrize(
    "package",
    ["conduit_core", "conduit_core.extension", "conduit_core.http", "conduit_core.daemon"],
)
def test_every_lazy_export_resolves(package: str) -> None:
    """The packages whose parts load on first use still offer every name of ``__all__``, each
    the object its submodule defines, and nothing else (in a fresh interpreter)."""
    run = (
        "import importlib\n"
        f"pkg = importlib.import_module({package!r})\n"
        "star = {}\n"
        f"exec('from {package} import *', star)\n"
        "missing = [n for n in pkg.__all__ if n not in star]\n"
        "extra = sorted(set(dir(pkg)) - set(pkg.__all__) - set(vars(pkg)))\n"
        "print(json.dumps({'missing': missing, 'extra': extra}))\n"
        "raise SystemExit(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", _PROBE.format(run=run)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"missing": [], "extra": []}


class _WorkPage(BaseHTTPRequestHandler):
    """A stand-in daemon's ``GET /v1/work``: one page holding one Work."""

    def do_GET(self) -> None:
        body = json.dumps({"items": [{
            "id": "w-1", "scope": "root", "binding": "noop", "kind": "task",
            "status": "completed", "scheduled_by": "", "created_at_ms": 0, "updated_at_ms": 0,
            "last_attempt": 1, "failure_count": 0,
        }], "next": None}).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_work_list_against_a_running_daemon_loads_no_event_loop(tmp_path: Path) -> None:
    """``conduit work list`` reads a running daemon with blocking calls: neither asyncio nor
    anyio, nor the scan of every distribution's entry points, is paid for it."""
    from conduit_core.daemon import PidFile

    server = ThreadingHTTPServer(("127.0.0.1", 0), _WorkPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        data = tmp_path / "data"
        data.mkdir()
        (data / "token").write_text("t")
        (data / "token").chmod(0o600)
        PidFile.in_dir(data).write("stand-in")  # this live process plays the daemon
        config = tmp_path / "conduit.toml"
        config.write_text(
            f'[settings]\ndata_dir = "{data}"\n'
            f'http.listen = "127.0.0.1:{server.server_address[1]}"\n'
        )
        run = (
            "import io, contextlib\n"
            "from conduit_core.cli import cli\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            f"    cli(['work', 'list', '--config', {str(config)!r}], prog_name='conduit',\n"
            "        standalone_mode=False)\n"
            "assert 'w-1' in out.getvalue(), out.getvalue()\n"
        )
        loaded = _loaded(run)
    finally:
        server.shutdown()
        server.server_close()
    assert "conduit_core.http._client" in loaded  # negative control: it did ask the daemon
    assert _heavy(loaded, ("asyncio", "anyio", "importlib.metadata")) == []
