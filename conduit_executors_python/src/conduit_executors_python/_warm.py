"""The warm worker: ``<python> -m conduit_executors_python._warm``, a wire-protocol program.

The daemon starts one per (interpreter, cwd, environment) of the warm python bindings it runs
(``mode = "warm"``) and supervises it like any executor program. It keeps the interpreter and
every imported function module loaded between attempts and runs attempts concurrently: an
``async def`` function as a task on the worker's event loop, a sync function in a thread of its
own. Input decoding, the call's result and exceptions go through the cold runner's own steps
(``_runner``), so both modes behave alike.

The function runs *inside* this process, so nothing of it outlives the worker: when the worker
dies (killed, or the daemon that started it is gone — its stdin reaches end-of-file and it exits
at once, threads and all), the attempt has no process left to adopt. A ``recover`` for an attempt
this worker does not know is answered ``resources_gone``: the attempt fails and its retry policy
applies (at-least-once). A stop cancels an async function's task, or raises ``StopCall`` inside
a sync function's thread; one still running ``stop_grace_seconds`` later makes the worker exit,
so that a verified stop is true (the daemon restarts it; its other attempts go through recovery).
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import os
import queue
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

import conduit_core.extension as ext
from conduit_core.extension import wire
from conduit_executors_python import _runner
from conduit_executors_python._config import PythonConfig, decode_config
from conduit_executors_python._proc import process_start

__all__ = ["StopCall", "main"]

#: How many finished attempts a worker remembers (a recover in the same daemon finds them).
_KEEP_FINISHED = 10_000
#: How many decoded binding configs a worker keeps.
_KEEP_CONFIGS = 256
#: How long ``run`` waits for the call to end before it answers ``launched`` without a result.
_INLINE_SECONDS = 0.005
#: The worker's exit status when a stop could not end a function in time.
EXIT_UNSTOPPABLE = 70


class StopCall(BaseException):
    """Raised inside a sync function's thread by a stop or a timeout (a BaseException, so an
    ``except Exception`` in the function does not swallow it)."""


class _Call:
    """One attempt running (or run) in this worker."""

    def __init__(self, execution_id: str, epoch: int, grace: float) -> None:
        self.execution_id = execution_id
        self.epoch = epoch
        self.grace = grace
        self.thread: int | None = None  # the ident of a sync function's thread while it runs
        self.lock = threading.Lock()  # orders a stop's raise against the thread's end
        self.sync = False  # a sync function: stopped in its thread, never by cancelling the task
        self.stopping = False
        self.task: asyncio.Task[ext.Result] | None = None

    async def stop(self) -> ext.StopEvidence:
        task = self.task
        if task is None or task.done():
            return ext.StopEvidence(verified=True, detail=f"ended (warm worker pid {os.getpid()})")
        self.stopping = True
        if self.sync:
            _raise_in_thread(self)  # or, not begun yet, it sees ``stopping`` and never begins
        else:
            task.cancel()
        done, _ = await asyncio.wait({task}, timeout=self.grace)
        if done:
            return ext.StopEvidence(verified=True, detail=f"stopped in warm worker {os.getpid()}")
        # Nothing else can end it here (a C call that never returns to Python, a function that
        # swallows cancellation): the worker ends, and the function with it.
        print(
            f"conduit python warm worker {os.getpid()}: attempt {self.execution_id} did not end "
            f"within {self.grace:g} s of its stop; the worker exits so that it cannot run on",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_UNSTOPPABLE)


def _raise_in_thread(call: _Call) -> None:
    """Raise ``StopCall`` in the call's thread, if its function still runs there."""
    with call.lock:
        if call.thread is not None:
            set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
            set_async(ctypes.c_ulong(call.thread), ctypes.py_object(StopCall))


def _clear_in_thread(ident: int) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)


class _Handle(ext.Handle):
    def __init__(self, call: _Call) -> None:
        self._call = call

    async def wait(self) -> ext.Result:
        task = self._call.task
        assert task is not None
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not (task.cancelled() and self._call.stopping):
                raise  # this wait itself was cancelled (the core stopped observing)
            # Stopped before the attempt's task took its first step: nothing ran.
            return _as_result(_stopped(), time.time())


class WarmWorker(ext.Executor):
    """Runs each attempt's call in this process; see the module docstring for what a crash does."""

    def __init__(self) -> None:
        self._calls: OrderedDict[str, _Call] = OrderedDict()
        self._loaded: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {}
        self._configs: dict[bytes, PythonConfig] = {}

    async def run(self, ctx: ext.ExecutionContext) -> ext.Handle:
        config = self._config(ctx.config)
        # The contract's durable mark that the attempt runs, before anything starts: which
        # worker runs it (what a stop after a daemon restart checks is gone).
        await ctx.persist_recovery({"mode": "warm", "worker": _identity()})
        call = _Call(ctx.execution_id, ctx.epoch, config.stop_grace_seconds)
        call.task = asyncio.get_running_loop().create_task(self._attempt(ctx, config, call))
        self._calls[ctx.execution_id] = call
        while len(self._calls) > _KEEP_FINISHED:
            oldest = next(iter(self._calls.values()))
            if oldest.task is not None and not oldest.task.done():
                break
            self._calls.popitem(last=False)
        # A quick function's result then travels inline in ``launched`` (the SDK sends it when
        # the handle's wait is done at once): two frames fewer per attempt. A longer one is
        # answered ``launched`` a few ms later, and its ``wait`` follows.
        await asyncio.wait({call.task}, timeout=_INLINE_SECONDS)
        return _Handle(call)

    async def recover(self, ctx: ext.ExecutionContext) -> ext.Handle:
        call = self._calls.get(ctx.execution_id)
        if call is None:
            raise ext.ResourcesGoneError(
                f"warm worker {os.getpid()} never ran this attempt: the worker that ran it is "
                "gone, and the function with it (it may have run partly)"
            )
        # Adopted at the new epoch (a lease moved while this daemon lived): acknowledged by the
        # same metadata, as every recover must.
        await ctx.persist_recovery({"mode": "warm", "worker": _identity()})
        return _Handle(call)

    async def stop(self, target: ext.StopTarget) -> ext.StopEvidence:
        call = self._calls.get(target.execution_id)
        if call is None:
            return ext.StopEvidence(
                verified=True, detail=f"not running in warm worker {os.getpid()}"
            )
        return await call.stop()

    async def interrupt(self, target: ext.StopTarget) -> ext.StopEvidence:
        return await self.stop(target)

    async def _attempt(self, ctx: ext.ExecutionContext, config: PythonConfig, call: _Call) -> Any:
        started = time.time()
        limit = _limit(config, ctx.deadline_ms, started)
        if limit is not None and limit <= 0:
            return _late_start()
        try:
            result = await asyncio.wait_for(self._call(ctx, config.function, call), limit)
        except TimeoutError:
            return ext.job_timeout_result(
                "function", time.time() - started, "ended in the warm worker",
                wall_minutes=_minutes(started),
            )  # fmt: skip
        except (asyncio.CancelledError, StopCall):
            if not call.stopping:
                raise
            result = _stopped()
        return _as_result(result, started)

    async def _call(self, ctx: ext.ExecutionContext, ref: str, call: _Call) -> dict[str, Any]:
        try:
            function, hints = self._load(ref)
            batch = b"\n".join(msgspec.json.encode(event) for event in ctx.inputs)
            kwargs = _runner._arguments(function, hints, _runner._latest_payload(batch))
        except _runner._Refused as exc:
            print(f"{exc.code}: {exc.message}", file=sys.stderr, flush=True)
            return _runner._failed(exc.code, exc.message, permanent=exc.permanent)
        try:
            if inspect.iscoroutinefunction(function):
                value = await function(**kwargs)
            else:
                call.sync = True
                value = await _in_thread(call, function, kwargs)
                if inspect.isawaitable(value):
                    value = await value
            return _runner._returned(value, hints)
        except _runner._Refused as exc:
            return _runner._failed(exc.code, exc.message, permanent=exc.permanent)
        except Exception as exc:
            traceback.print_exc()
            return _runner._raised(exc)

    def _config(self, raw: Mapping[str, Any]) -> PythonConfig:
        """The binding config, decoded once per distinct config."""
        key = msgspec.json.encode(raw)
        config = self._configs.get(key)
        if config is None:
            if len(self._configs) >= _KEEP_CONFIGS:
                self._configs.clear()
            config = self._configs[key] = decode_config(raw)
        return config

    def _load(self, ref: str) -> tuple[Callable[..., Any], dict[str, Any]]:
        """Imported once per worker: what makes it warm. A failed import is tried again."""
        if ref not in self._loaded:
            self._loaded[ref] = _runner._load_typed(ref)
        return self._loaded[ref]


async def _in_thread(call: _Call, function: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Run a sync function in a thread of its own (a stop can raise ``StopCall`` in it)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(value)
        else:
            done.set_exception(error)

    def body() -> None:
        ident = threading.get_ident()
        value: Any = None
        error: BaseException | None = None
        try:
            with call.lock:
                call.thread = ident
            if call.stopping:  # stopped before it began: never call it
                raise StopCall
            value = function(**kwargs)
        except BaseException as exc:  # StopCall included: handed to the loop as it is
            error = exc
        while True:  # a StopCall raised as the call ended may still be pending: clear it
            try:
                with call.lock:  # after this, no stop raises in this thread any more
                    call.thread = None
                _clear_in_thread(ident)
                break
            except StopCall:
                continue
        loop.call_soon_threadsafe(settle, value, error)

    _THREADS.submit(body)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        # A timeout (wait_for cancels this await): end the thread's call as a stop does.
        if not done.done():
            call.stopping = True
            _raise_in_thread(call)
            finished, _ = await asyncio.wait({done}, timeout=call.grace)
            if not finished:
                print(
                    f"conduit python warm worker {os.getpid()}: attempt {call.execution_id} "
                    f"did not end within {call.grace:g} s of its timeout; the worker exits",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(EXIT_UNSTOPPABLE)
        raise


def _stopped() -> dict[str, Any]:
    return _runner._failed("stopped", "the attempt was stopped", permanent=False)


def _identity() -> dict[str, int]:
    """This worker's pid and its start time in clock ticks since boot (a reused pid differs)."""
    return {"pid": os.getpid(), "started": process_start(os.getpid()) or 0}


class _Threads:
    """Threads kept for sync calls (starting one costs more than a short call): a call takes an
    idle one or starts a new one, so every running call has a thread of its own."""

    def __init__(self, keep: int = 64) -> None:
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._keep = keep
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            jobs = self._idle.pop() if self._idle else None
        if jobs is None:
            jobs = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(jobs,), daemon=True).start()
        jobs.put(job)

    def _serve(self, jobs: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            jobs.get()()  # a job catches everything itself (and clears a pending StopCall)
            with self._lock:
                if len(self._idle) >= self._keep:
                    return
                self._idle.append(jobs)


_THREADS = _Threads()


def _limit(config: PythonConfig, deadline_ms: int | None, now: float) -> float | None:
    """Seconds the call may run: the binding's timeout and the attempt's deadline."""
    limits = [] if config.timeout_seconds is None else [config.timeout_seconds]
    if deadline_ms is not None:
        limits.append(deadline_ms / 1000.0 - now)
    return min(limits) if limits else None


def _minutes(started: float) -> float:
    return max(time.time() - started, 0.0) / 60.0


def _late_start() -> ext.Result:
    return ext.Result(
        outcome=ext.OutcomeKind.FAILED,
        summary="timeout: the attempt's deadline passed before its function could start; "
        "nothing ran",
        usage=ext.Usage(units={ext.WALL_TIME_UNIT: 0.0}),
        data={"code": "timeout", "started": False},
    )


def _as_result(result: dict[str, Any], started: float) -> ext.Result:
    """The cold runner's result file, as the contract's Result (with the wall time used)."""
    converted = msgspec.convert(result, ext.Result)
    usage = ext.Usage(units={ext.WALL_TIME_UNIT: _minutes(started)})
    return msgspec.structs.replace(converted, usage=usage)


def main() -> None:
    sys.path.insert(0, os.getcwd())  # as the cold runner: the job's cwd is importable
    from conduit_executors_python.executor import SHELL_GENERATION

    generations = sorted(SHELL_GENERATION)
    manifest = wire.manifest_for(
        name="python", generation=generations[-1], historical_generations=generations[:-1],
        pool="jobs", capabilities=["stop", "interrupt"],
    )  # fmt: skip
    worker = WarmWorker()
    wire.serve(manifest, dict.fromkeys(generations, worker))
    # The daemon is gone (end-of-file on stdin) or asked us to shut down: the functions still
    # running in threads end with the process, never after it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
