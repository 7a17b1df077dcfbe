"""A process-carried task's side of the boundary: the loop a node's worker process runs
(``serve``), and the signals its task's token speaks through (docs/design.md, "Process
carriers").

The node sends a job: where the function lives (module and qualified name, never the
function itself), the arguments, the upstream results and which task and attempt this
is. The child imports the function once, calls it with a ``CancellationToken`` whose
signals ask the node at each checkpoint (a round trip: the node records the heartbeat and
progress, answers a stop with ``stop`` and holds the answer while the task is paused),
and sends back what it returned or raised. It exits when the node asks, and at once when
the node is gone (its pipe ends), so a node killed with ``kill -9`` leaves no child
running.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from ..current import enter, install_log_context, leave
from ..errors import StopRequested
from ..model import Progress
from .token import CancellationToken

__all__ = ["ChildSignals", "Job", "Raised", "locate", "receive", "send", "serve"]

NICE = 10
"""How much lower a worker process's CPU priority is than its node's: CPU-bound tasks
take the cores the service leaves, and its own endpoints keep answering
(bench/processes.py, 2 cores: an endpoint in the node's process answered at p99 in
7.3 ms, 9.4x its idle p99, while four CPU-bound tasks ran at niceness 0; in 0.8 ms, 1.2x,
at 10; the tasks' own time unchanged on an otherwise idle machine)."""

ORPHANED = 70
"""The exit code of a worker process whose node went away while it ran a task."""


def send(conn: Connection, message: Any) -> None:
    """One message across the boundary, pickled plainly: what crosses is the task's
    arguments and result (checked with plain ``pickle`` at submit), never a handle that
    needs ``multiprocessing``'s own reducers, whose pickler ``Connection.send`` builds
    anew for each message (a job 1.9 µs against 5.7 as a slotted dataclass through it,
    an answer 0.3 against 1.8; with the pool's slots, bench/processes.py's no-op row
    went from 0.43x to 0.50-0.57x of ProcessPoolExecutor)."""
    conn.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))


def receive(conn: Connection) -> Any:
    """The next message ``send`` sent on ``conn``."""
    return pickle.loads(conn.recv_bytes())


class Job(NamedTuple):
    """One attempt sent to a worker process (a tuple: it pickles without a
    per-field walk)."""

    module: str
    qualname: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    upstream: Mapping[str, Any]
    task_id: str
    name: str
    attempt: int
    bucket: int | None
    log_level: int = logging.WARNING
    """The node's root log level: the child's records at it or above cross to the node."""
    trace_context: str | None = None
    """The attempt's run span as W3C trace context, when the node is instrumented: the
    child makes it current around the call, so the task's own spans nest under it."""


@dataclass(frozen=True, slots=True)
class Raised:
    """What the task raised, as it crosses back: the exception itself where it pickles,
    else its type's name and message; the child's traceback as text either way."""

    exception: BaseException | None
    type_name: str
    message: str
    traceback: str


def locate(module: str, qualname: str) -> Callable[..., Any]:
    """The callable at ``module``'s ``qualname`` (a ``Task`` calls its function)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not callable(found):
        raise TypeError(f"{module}.{qualname} is not callable")
    return found  # type: ignore[no-any-return]


class _ToNode(logging.Handler):
    """Sends the child's log records to the node, one-way, beside the job's round trips
    (the node's logging then handles them, the task's names on each)."""

    def __init__(self, conn: Connection, lock: threading.Lock) -> None:
        super().__init__()
        self._conn = conn
        self._lock = lock

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = dict(record.__dict__)
            if _traced is not None:
                _traced.annotate(fields)
            fields["msg"] = record.getMessage()
            fields["args"] = None
            if record.exc_info:
                fields["exc_text"] = logging.Formatter().formatException(record.exc_info)
            fields["exc_info"] = None
            fields["processName"] = f"worker {os.getpid()}"
            with self._lock:
                send(self._conn, ("log", fields))
        except Exception:
            self.handleError(record)


class ChildSignals:
    """What a token in a worker process reports to, and hears from: the node, over the
    job's connection. Each call is one round trip; the node answers once it has carried
    the request out (a checkpoint of a paused task is answered at the resume)."""

    __slots__ = ("_conn", "_progress", "_sending", "_stopped", "task_id", "upstream")

    def __init__(
        self,
        conn: Connection,
        task_id: str,
        upstream: Mapping[str, Any],
        sending: threading.Lock,
    ) -> None:
        self._conn = conn
        self._sending = sending
        self.task_id = task_id
        self.upstream = upstream
        self._progress: Progress | None = None
        self._stopped: str | None = None

    def _ask(self, *request: Any) -> Any:
        with self._sending:
            send(self._conn, request)
        answer = receive(self._conn)
        if isinstance(answer, tuple) and answer:
            if answer[0] == "stop":
                self._stopped = answer[1] or f"task {self.task_id}: stop requested"
                raise StopRequested(self._stopped)
            if answer[0] == "error":  # the node refused the request (progress, say)
                raise answer[1]
        return answer

    def checkpoint(self, progress: Progress | float | None = None) -> None:
        self._ask("checkpoint", progress)
        if progress is not None:
            self._progress = (
                progress if isinstance(progress, Progress) else Progress(current=progress)
            )

    def sleep(self, seconds: float) -> None:
        self._ask("sleep", seconds)

    async def acheckpoint(self, progress: Progress | float | None = None) -> None:
        self.checkpoint(progress)

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

    @property
    def stop_kind(self) -> str | None:
        if self._stopped is None and self._ask("stop_requested"):
            self._stopped = f"task {self.task_id}: stop requested"
        return None if self._stopped is None else "stop"

    @property
    def progress(self) -> Progress | None:
        return self._progress


@dataclass(frozen=True, slots=True)
class _Running:
    """The task ``chongming_task.current()`` names in the child."""

    task_id: str
    name: str
    bucket: int | None
    signals: _Attempt


@dataclass(frozen=True, slots=True)
class _Attempt:
    attempt: int


class _Traced:
    """The run span's context made current in the child while its attempt runs
    (``opentelemetry`` imported only when a job carries one: the core stays stdlib-only)."""

    def __init__(self, text: str) -> None:
        from opentelemetry import context, trace

        from ..otel import stored_context

        self._context, self._trace = context, trace
        found = stored_context(text)
        self._token = None if found is None else context.attach(found)

    def annotate(self, fields: dict[str, Any]) -> None:
        """A record's trace and span ids: the span current where it was made."""
        span = self._trace.get_current_span().get_span_context()
        if span.is_valid:
            fields["trace_id"] = format(span.trace_id, "032x")
            fields["span_id"] = format(span.span_id, "016x")

    def close(self) -> None:
        if self._token is not None:
            self._context.detach(self._token)


_traced: _Traced | None = None
"""The current attempt's trace context, if its job carried one."""


def _trace(text: str | None) -> _Traced | None:
    if text is None:
        return None
    try:
        return _Traced(text)
    except Exception:  # no opentelemetry here, or a context it cannot read: untraced
        return None


def _watch_node(alive: Connection) -> None:
    """Exit the moment the node is gone: its end of ``alive`` closes with it."""
    with contextlib.suppress(EOFError, OSError):
        alive.recv()
    os._exit(ORPHANED)


def _raised(exc: BaseException) -> Raised:
    text = "".join(traceback.format_exception(exc))
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        kept: BaseException | None = None
    else:
        kept = exc
    return Raised(kept, type(exc).__qualname__, str(exc), text)


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent (the fork server, which ends
    with the node) dies, even while it is stopped and its watch thread cannot run."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def serve(conn: Connection, alive: Connection) -> None:
    """A worker process's life: jobs until the node sends ``None`` or goes away."""
    global _traced
    _die_with_parent()
    with contextlib.suppress(OSError):  # the service's own threads come first for a core
        os.nice(NICE)
    install_log_context()
    threading.Thread(target=_watch_node, args=(alive,), name="node-watch", daemon=True).start()
    sending = threading.Lock()  # the task's threads may log while it checkpoints
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_ToNode(conn, sending))
    found: dict[tuple[str, str], Callable[..., Any]] = {}
    while True:
        try:
            job = receive(conn)
        except (EOFError, OSError):
            return
        if job is None:
            return
        root.setLevel(job.log_level)
        mark = enter(_Running(job.task_id, job.name, job.bucket, _Attempt(job.attempt)))
        _traced = _trace(job.trace_context)
        try:
            where = (job.module, job.qualname)
            func = found.get(where)
            if func is None:
                func = found[where] = locate(job.module, job.qualname)
            signals = ChildSignals(conn, job.task_id, job.upstream, sending)
            result = func(CancellationToken(signals), *job.args, **job.kwargs)
        except BaseException as exc:
            answer: tuple[str, Any] = ("raised", _raised(exc))
        else:
            answer = ("returned", result)
        finally:
            if _traced is not None:
                _traced.close()
                _traced = None
            leave(mark)
        try:
            with sending:
                send(conn, answer)
        except (EOFError, OSError):
            return
        except Exception as exc:  # the result does not pickle
            failed = _raised(TypeError(f"its result cannot cross back: {exc}"))
            with sending:
                send(conn, ("raised", failed))
