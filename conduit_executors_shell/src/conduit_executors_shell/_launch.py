"""Starting a job: a ``/bin/sh`` wrapper that leads a new session and records the exit status.

The wrapper is the session and process-group leader, so a signal to the group reaches the job and
everything it started, and killing the daemon (another session) reaches none of them. When the job
ends the wrapper creates ``exit-status.<N>`` in the workspace, so the status survives a daemon
that is gone by then. Before it starts the job it writes its pid to ``wrapper.pid``: a launch
that left no such file (and no process carrying its marker) never started the job.

The wrapper's first act is to check the attempt's deadline against the system's uptime clock
(``/proc/uptime``, read by a shell builtin: no extra process per job). A daemon paused between its
own deadline check and the spawn (SIGSTOP, a starved host) forks the wrapper late; the wrapper,
which that pause cannot reach, then starts nothing and leaves ``not-started.past-deadline`` in the
workspace: the attempt times out with nothing run, and its retry runs the job once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

import msgspec
import psutil

from conduit_core.extension import InputEvent, NotStartedError, OperationError
from conduit_executors_shell._config import ShellConfig
from conduit_executors_shell._metadata import JobRecord
from conduit_executors_shell._workspace import Workspace

__all__ = ["EXECUTION_TAG", "LAUNCH_MARKER", "LaunchedJob", "json_lines", "launch_job"]

#: The environment variable that tags every process of a job with its execution id; stop finds
#: the job's processes by it even when no recovery metadata was recorded.
EXECUTION_TAG = "CONDUIT_EXECUTION_ID"
#: The environment variable carrying the per-launch marker ``<execution>/<epoch>/<nonce>``, which
#: the launch intent records before the wrapper starts; discovery finds the job's processes by it.
LAUNCH_MARKER = "CONDUIT_LAUNCH_MARKER"

# Variables of the daemon's own environment a job inherits. Everything else (the daemon's
# credentials, say) stays out; the run environment and the binding's env are added over these.
_INHERITED_VARIABLES = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ", "TMPDIR")

# First of all, the attempt's deadline, in centiseconds of uptime (/proc/uptime has two decimals):
# a wrapper that starts past it starts nothing (see the module's docstring).
_DEADLINE_CHECK = """\
if [ -n "${{CONDUIT_DEADLINE_UPTIME_CS:-}}" ] && read -r up _ </proc/uptime; then
  if [ "${{up%.*}}${{up#*.}}" -ge "$CONDUIT_DEADLINE_UPTIME_CS" ]; then
    : >"$ws/not-started.past-deadline"; exit 0
  fi
fi
unset CONDUIT_DEADLINE_UPTIME_CS
"""

# "$1" is the workspace, the rest is the job's argv. The wrapper catches the stop signals with a
# no-op trap, so a signal to the group ends the job while the wrapper lives on to record its status
# (caught, not ignored: the job gets the default action back). The status file is created, not
# written, so its appearance is atomic (see _workspace).
_WRAPPER = """trap : {traps}
ws=$1; shift
""" + _DEADLINE_CHECK + """echo $$ >"$ws/wrapper.pid"
"$@" <"$ws/input.jsonl" >"$ws/stdout" 2>"$ws/stderr"
status=$?
: >"$ws/exit-status.$status"
exit "$status"
"""

# With accept_input the job reads a FIFO that ``tail -f`` feeds from input.jsonl, so lines
# appended later by inject reach it. The job opens the FIFO read-write so it never waits for the
# feeder to open it (and, like any inject stream, it sees no end of input).
_WRAPPER_ACCEPTING_INPUT = """trap : {traps}
ws=$1; shift
""" + _DEADLINE_CHECK + """echo $$ >"$ws/wrapper.pid"
tail -c +1 -f "$ws/input.jsonl" >"$ws/input.fifo" &
feeder=$!
"$@" 0<>"$ws/input.fifo" >"$ws/stdout" 2>"$ws/stderr"
status=$?
kill "$feeder" 2>/dev/null
: >"$ws/exit-status.$status"
exit "$status"
"""

_ALWAYS_TRAPPED = ("TERM", "INT", "HUP")
#: The attempt's deadline on the uptime clock, in centiseconds (the wrapper's own check).
_DEADLINE_VARIABLE = "CONDUIT_DEADLINE_UPTIME_CS"
_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


def wrapper_script(config: ShellConfig) -> str:
    traps = list(_ALWAYS_TRAPPED)
    stop_signal = config.signal()
    name = stop_signal.name.removeprefix("SIG")
    if stop_signal not in _UNCATCHABLE and name not in traps:
        traps.append(name)
    template = _WRAPPER_ACCEPTING_INPUT if config.accept_input else _WRAPPER
    return template.format(traps=" ".join(traps))


class LaunchedJob:
    """A job this process started: its record and the wrapper's ``Popen`` (to reap it)."""

    def __init__(self, record: JobRecord, wrapper: subprocess.Popen[bytes]) -> None:
        self.record = record
        self.wrapper = wrapper


def launch_job(
    config: ShellConfig,
    workspace: Workspace,
    *,
    inputs: Sequence[InputEvent],
    run_environment: Mapping[str, str],
    job_variables: Mapping[str, str],
    marker: str | None = None,
    deadline_ms: int | None = None,
) -> LaunchedJob:
    """Start the job detached; blocking (call it from a worker thread).

    ``NotStartedError`` instead when the attempt's ``deadline_ms`` has passed by the last instant
    before the spawn (its host stalled mid-launch): a job started now would only be stopped, and
    its retry would run it again."""
    workspace.input.write_bytes(json_lines(inputs))
    script = wrapper_script(config)
    if config.accept_input:
        os.mkfifo(workspace.input_fifo, 0o600)
    env = {name: os.environ[name] for name in _INHERITED_VARIABLES if name in os.environ}
    env.update(run_environment)
    env.update(config.env)
    env.update(job_variables)
    launched_at = time.time()
    if deadline_ms is not None:
        left_s = deadline_ms / 1000 - launched_at
        if left_s <= 0:
            raise NotStartedError(
                f"the attempt's deadline passed {-left_s:.3g} s before its job could start; "
                "nothing was started"
            )
        uptime_s = time.clock_gettime(time.CLOCK_BOOTTIME)  # the clock /proc/uptime reads
        env[_DEADLINE_VARIABLE] = str(int((uptime_s + left_s) * 100))
    try:
        wrapper = subprocess.Popen(
            ["/bin/sh", "-c", script, "conduit-shell", str(workspace.path), *config.argv()],
            cwd=config.cwd if config.cwd is not None else workspace.path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        # The wrapper is /bin/sh, so this is the cwd (or the system refusing a process).
        raise OperationError(
            "invalid_config",
            f"shell job could not start in cwd {config.cwd!r}: {exc.strerror or exc}",
            permanent=True,
        ) from exc
    # Our own child stays visible (as a zombie at worst) until we reap it, so this cannot fail.
    create_time = psutil.Process(wrapper.pid).create_time()
    record = JobRecord(
        pid=wrapper.pid,
        pgid=wrapper.pid,
        create_time=create_time,
        workspace=str(workspace.path),
        launched_at=launched_at,
        marker=marker,
    )
    return LaunchedJob(record, wrapper)


def json_lines(inputs: Sequence[InputEvent]) -> bytes:
    return b"".join(msgspec.json.encode(event) + b"\n" for event in inputs)
