"""Write a real (if tiny) installed distribution into a folder: a package and its dist-info.

Putting the folder on ``sys.path`` (or ``PYTHONPATH`` for a subprocess) makes
``importlib.metadata`` find it exactly as it finds a pip-installed package, so plugin loading is
tested through real entry points without installing broken packages into the shared venv.
"""

from __future__ import annotations

from pathlib import Path


def write_plugin_dist(
    root: Path,
    *,
    dist: str,
    module: str,
    source: str,
    manifest: str | None,
    entry_name: str | None = None,
) -> Path:
    pkg = root / module
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.py").write_text(source)
    if manifest is not None:
        (pkg / "conduit-manifest.toml").write_text(manifest)
    info = root / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[conduit]\n{entry_name or dist} = {module}.plugin\n")
    (info / "RECORD").write_text("")
    return root


EXECUTOR_SOURCE = """
from conduit_core.extension import (
    ExecutorRegistration, Executor, Handle, OutcomeKind, Result, StopEvidence, hookimpl,
)

class _Done(Handle):
    async def wait(self):
        return Result(outcome=OutcomeKind.COMPLETED)

class Noop(Executor):
    async def run(self, ctx):
        return _Done()
    async def recover(self, ctx):
        return _Done()
    async def stop(self, target):
        return StopEvidence(verified=True)

@hookimpl
def conduit_executors():
    return [ExecutorRegistration(name=NAME, generation=GEN, executor=Noop())]
"""


def executor_source(name: str, generation: int) -> str:
    return f"NAME = {name!r}\nGEN = {generation}\n" + EXECUTOR_SOURCE


def executor_manifest(dist: str, name: str, generation: int, historical: str = "[]") -> str:
    return (
        f'schema = 1\npackage = "{dist}"\n\n[[executors]]\nname = "{name}"\n'
        f"generation = {generation}\nhistorical_generations = {historical}\n"
    )
