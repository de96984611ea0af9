"""The chaos drill's executor kinds: each one's binding, its job, and how to find what it left.

Every kind runs the same job, which appends ``<item> <pid> <start>`` to ``starts.log`` as it
begins and ``<item> <pid> <start> <end>`` to ``side-effects.log`` as it ends, so duplicate runs
are counted from the jobs themselves. ``shell``: the shell executor. ``container``: the Docker
executor, the job in the local test image with the drill's folder mounted at the same path (the
image's ``date`` has no nanoseconds: its clock is ``/proc/uptime``, the host's, compared only
within one item). ``wire``: ``bench/wire_drill_program.py``, an out-of-process program over the
wire protocol configured as ``[executors.drill-wire]``.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import psutil

KINDS = ("shell", "container", "wire")
TEST_IMAGE = "conduit-test-busybox:latest"  # built by scripts/services.sh
WIRE_PROGRAM = Path(__file__).resolve().parent / "wire_drill_program.py"
# The environment variables that mark a job's processes, per kind (container jobs are found by
# their labels instead).
LAUNCH_MARKERS = ("CONDUIT_LAUNCH_MARKER", "CONDUIT_EXAMPLE_WIRE_LAUNCH")

_CLOCK = {
    "shell": "$(date +%s.%N)",  # seconds since the epoch with nanoseconds (GNU date)
    "container": '$(cut -d" " -f1 /proc/uptime)',
    "wire": "$(date +%s.%N)",
}
# The job's own pid is $$ (1 or so in a container: only the field count matters there).
JOB = (
    's={clock}; echo "$CONDUIT_WORK_ID $$ $s" >> {root}/starts.log; sleep {job}; '
    'echo "$CONDUIT_WORK_ID $$ $s {clock}" >> {root}/side-effects.log'
)
_BINDINGS = {
    "shell": """
[bindings.drill]
executor = "shell"
config = {{ command = '{command}', stop_grace_seconds = 2 }}
""",
    "container": """
[bindings.drill]
executor = "container"
config = {{ image = "{image}", command = ["sh", "-c", '{command}'], stop_grace_seconds = 2, \
mounts = [{{ source = "{root}", target = "{root}" }}] }}
""",
    "wire": """
[executors.drill-wire]
command = ["{python}", "{program}", "{prefix}"]

[bindings.drill]
executor = "drill-wire"
config = {{ command = '{command}' }}
""",
}


def binding(kind: str, root: Path, job_seconds: float, prefix: str) -> str:
    """The config text that binds ``drill`` to ``kind``, running the drill's job."""
    command = JOB.format(clock=_CLOCK[kind], root=root, job=job_seconds)
    return _BINDINGS[kind].format(
        command=command, image=TEST_IMAGE, root=root, python=sys.executable,
        program=WIRE_PROGRAM, prefix=prefix,
    )  # fmt: skip


def leftovers(kind: str, prefix: str) -> list[str]:
    """What the drill's items left behind: live job processes, wire programs, containers."""
    found = _processes(prefix)
    if kind == "container":
        found += _containers(prefix)
    return found


def remove(leftover: str) -> None:
    """Kill a leftover process or remove a leftover container (after the check)."""
    kind, ident = leftover.split()[:2]
    if kind == "pid":
        with contextlib.suppress(psutil.Error, ValueError):
            psutil.Process(int(ident)).kill()
    elif kind == "container":
        import docker

        with contextlib.suppress(docker.errors.DockerException):
            docker.from_env().containers.get(ident).remove(force=True)


def _processes(prefix: str) -> list[str]:
    found = []
    for process in psutil.process_iter(["status", "cmdline"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if prefix in (process.info["cmdline"] or []):
            found.append(f"pid {process.pid} wire program {prefix}")
            continue
        try:
            environ = process.environ()
        except psutil.Error:
            continue
        marker = next((environ[m] for m in LAUNCH_MARKERS if m in environ), None)
        if marker is not None and environ.get("CONDUIT_WORK_ID", "").startswith(prefix):
            found.append(f"pid {process.pid} {marker}")
    return found


def _containers(prefix: str) -> list[str]:
    import docker

    from conduit_executors_container import WORK_LABEL

    client = docker.from_env()
    try:
        return [
            f"container {c.short_id} {c.labels.get(WORK_LABEL)} {c.status}"
            for c in client.containers.list(all=True, filters={"label": WORK_LABEL})
            if c.labels.get(WORK_LABEL, "").startswith(prefix)
        ]
    finally:
        client.close()
