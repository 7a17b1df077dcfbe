"""A process-carried task's side of the boundary: the wire a node and its worker process
speak over, the loop a worker process runs (``serve``), and the signals its task's token
speaks through (docs/design.md, "Process carriers").

The node sends a job: where the function lives (module and qualified name, never the
function itself), the arguments, the upstream results and which task and attempt this
is. The child imports the function once, calls it with a ``CancellationToken`` whose
signals ask the node at each checkpoint (a round trip: the node records the heartbeat and
progress, answers a stop with ``stop`` and holds the answer while the task is paused),
and sends back what it returned or raised.

Every frame on the wire carries a mark, its kind and the number of the job it belongs
to, so neither side ever takes a frame for another job's: a frame without the mark, of a
kind the reader does not expect, or of another job, means the stream cannot be trusted
(``Unreadable``), and the node ends that worker before it sends it anything else. A
worker that cannot read what the node sent exits with ``UNREADABLE``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import runpy
import socket
import struct
import sys
import threading
import traceback
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..current import enter, install_log_context, leave
from ..errors import StopRequested
from ..model import Progress
from .token import CancellationToken

__all__ = [
    "ChildSignals",
    "Job",
    "Raised",
    "Unreadable",
    "Wire",
    "load_main",
    "locate",
    "serve",
]

NICENESS = 10
"""How much lower a worker process's CPU priority is than its node's, unless the node
says otherwise (``Controller(process_niceness=...)``): CPU-bound tasks take the cores
the service leaves, and its own endpoints keep answering (docs/benchmarks.md,
``bench/processes.py``)."""

UNREADABLE = 71
"""The exit code of a worker process that could not read what its node sent."""

# -- the wire ---------------------------------------------------------------------------------

# node -> worker
JOB = 1
"""An attempt to run (body: ``Job``)."""
JOB_IN_MAIN = 2
"""An attempt of a function defined in the program's ``__main__``: the worker imports
that first, so the body's references to it resolve."""
ANSWER = 3
"""The answer to the worker's request (body: ``None``, a bool, ``("stop", why)`` or
``("error", exc)``)."""
EXIT = 4
"""Retire: the worker exits."""
# worker -> node
RETURNED = 10
"""What the function returned (body: the value)."""
RAISED = 11
"""What the function raised (body: ``Raised``)."""
LOG = 12
"""A log record, one-way (body: its plain fields and its extra fields pickled apart)."""
CHECKPOINT = 13
SLEEP = 14
STOP_ASKED = 15

_MARK = b"CMTw"
_HEADER = struct.Struct("!4sBQQ")  # mark, kind, job number, body length
_SMALL = 1 << 16  # a frame at most this long is sent in one write


class Unreadable(Exception):
    """What came over a worker's wire is not a frame the other side sent for this job:
    the stream cannot be trusted from here on."""


class Wire:
    """One end of a worker's stream: frames of a kind, a job number and a pickled body.
    ``send`` may be called from several threads (it writes each frame whole under its
    lock); one thread reads at a time, through a buffer, so a frame's header and a small
    body come in one system call, not two."""

    __slots__ = ("_lock", "_reader", "_sock")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._reader = sock.makefile("rb", buffering=_SMALL)
        self._lock = threading.Lock()

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        return self._sock.fileno() == -1

    def close(self) -> None:
        self._reader.close()  # the descriptor is let go once both are closed
        self._sock.close()

    def send(self, kind: int, job: int, body: Any = None) -> None:
        """One frame; the body pickled plainly (``pickle.PicklingError`` and the like
        propagate, nothing sent)."""
        self.send_bytes(kind, job, pickle.dumps(body, pickle.HIGHEST_PROTOCOL))

    def send_bytes(self, kind: int, job: int, data: bytes) -> None:
        header = _HEADER.pack(_MARK, kind, job, len(data))
        with self._lock:
            if len(data) <= _SMALL:
                self._sock.sendall(header + data)
            else:
                self._sock.sendall(header)
                self._sock.sendall(data)

    def receive(self) -> tuple[int, int, bytes]:
        """The next frame: its kind, job number and body. ``EOFError`` at the end of the
        stream; ``Unreadable`` for bytes that are not a frame."""
        head = self._reader.read(_HEADER.size)
        if len(head) < _HEADER.size:
            raise EOFError("the other end closed the stream")
        mark, kind, job, length = _HEADER.unpack(head)
        if mark != _MARK:
            raise Unreadable(f"bytes that are not a frame ({mark!r}...)")
        body = self._reader.read(length)
        if len(body) < length:
            raise EOFError("the other end closed the stream in a frame")
        return kind, job, body


def load(body: bytes, what: str) -> Any:
    """A frame's body unpickled; ``Unreadable`` naming ``what`` if it cannot be."""
    try:
        return pickle.loads(body)
    except Exception as exc:
        raise Unreadable(f"{what} that cannot be read ({type(exc).__name__}: {exc})") from exc


# -- what crosses -----------------------------------------------------------------------------


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
    """What the task raised, as it crosses back: the exception pickled apart (``None``
    where it does not pickle), and its type's name, message and the child's traceback as
    text, so the node can say what happened even where it cannot rebuild it."""

    pickled: bytes | None
    type_name: str
    message: str
    traceback: str


def raised(exc: BaseException, note: str | None = None) -> Raised:
    """``exc`` as it crosses back (``note``: added to it first, saying where it was
    raised)."""
    if note is not None:
        exc.add_note(note)
    text = "".join(traceback.format_exception(exc))
    pickled: bytes | None
    try:
        pickled = pickle.dumps(exc, pickle.HIGHEST_PROTOCOL)
        pickle.loads(pickled)
    except Exception:
        pickled = None
    return Raised(pickled, type(exc).__qualname__, str(exc), text)


def locate(module: str, qualname: str) -> Callable[..., Any]:
    """The callable at ``module``'s ``qualname`` (a ``Task`` calls its function)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not callable(found):
        raise TypeError(f"{module}.{qualname} is not callable")
    return found  # type: ignore[no-any-return]


def load_main(main: tuple[str, str]) -> None:
    """Import the node's main module in this worker as ``multiprocessing`` does (run as
    ``__mp_main__``, so its ``if __name__ == "__main__":`` block does not run), and make
    it this process's ``__main__``: a job naming a function defined there finds it.
    ``main`` is ``("path", script)`` or ``("name", module)``."""
    how, where = main
    module = types.ModuleType("__mp_main__")
    if how == "path":
        found = runpy.run_path(where, run_name="__mp_main__")
    else:
        found = runpy.run_module(where, run_name="__mp_main__", alter_sys=True)
    module.__dict__.update(found)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    global _main_loaded
    _main_loaded = True


_main_loaded = False


# -- the worker's side ------------------------------------------------------------------------

_LOG_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
"""A record's own fields: everything else on it is a caller's ``extra``."""


class _ToNode(logging.Handler):
    """Sends the child's log records to the node, one-way, beside the job's round trips
    (the node's logging then handles them, the task's names on each). A record's
    ``extra`` fields are pickled apart from its own, so a value the node cannot rebuild
    costs that value, never the record or the stream."""

    def __init__(self, wire: Wire, job: Callable[[], int]) -> None:
        super().__init__()
        self._wire = wire
        self._job = job

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields: dict[str, Any] = {}
            extra: dict[str, Any] = {}
            for key, value in record.__dict__.items():
                (fields if key in _LOG_FIELDS else extra)[key] = value
            if _traced is not None:
                _traced.annotate(extra)
            fields["msg"] = record.getMessage()
            fields["args"] = None
            if record.exc_info:
                fields["exc_text"] = logging.Formatter().formatException(record.exc_info)
            fields["exc_info"] = None
            fields["processName"] = f"worker {os.getpid()}"
            try:
                kept = pickle.dumps(extra, pickle.HIGHEST_PROTOCOL) if extra else b""
            except Exception:  # a value that does not pickle: said as text
                kept = pickle.dumps({key: repr(value) for key, value in extra.items()})
            self._wire.send(LOG, self._job(), (fields, kept))
        except Exception:
            self.handleError(record)


class ChildSignals:
    """What a token in a worker process reports to, and hears from: the node, over the
    worker's wire. Each call is one round trip, one at a time whichever thread of the
    task asks; the node answers once it has carried the request out (a checkpoint of a
    paused task is answered at the resume). Once its job has ended (a thread the task
    left behind), a call is refused with a stop, never sent."""

    __slots__ = (
        "_asking",
        "_job",
        "_over",
        "_progress",
        "_stopped",
        "_wire",
        "task_id",
        "upstream",
    )

    def __init__(self, wire: Wire, job: int, task_id: str, upstream: Mapping[str, Any]) -> None:
        self._wire = wire
        self._job = job
        self._asking = threading.Lock()
        self._over = False
        self.task_id = task_id
        self.upstream = upstream
        self._progress: Progress | None = None
        self._stopped: str | None = None

    def over(self) -> None:
        """Its job has ended: the token speaks no more."""
        with self._asking:
            self._over = True

    def _ask(self, kind: int, request: Any) -> Any:
        with self._asking:
            if self._over:
                raise StopRequested(f"task {self.task_id}: its attempt is over")
            self._wire.send(kind, self._job, request)
            try:
                got, job, body = self._wire.receive()
                if got != ANSWER or job != self._job:
                    raise Unreadable(f"a frame of kind {got} for job {job}")
                answer = load(body, "an answer")
            except (EOFError, OSError, Unreadable):
                os._exit(UNREADABLE)  # the node is gone, or its stream cannot be trusted
        if isinstance(answer, tuple) and answer:
            if answer[0] == "stop":
                self._stopped = answer[1] or f"task {self.task_id}: stop requested"
                raise StopRequested(self._stopped)
            if answer[0] == "error":  # the node refused the request (progress, say)
                raise answer[1]
        return answer

    def checkpoint(self, progress: Progress | float | None = None) -> None:
        self._ask(CHECKPOINT, progress)
        if progress is not None:
            self._progress = (
                progress if isinstance(progress, Progress) else Progress(current=progress)
            )

    def sleep(self, seconds: float) -> None:
        self._ask(SLEEP, seconds)

    async def acheckpoint(self, progress: Progress | float | None = None) -> None:
        self.checkpoint(progress)

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

    @property
    def stop_kind(self) -> str | None:
        if self._stopped is None and self._ask(STOP_ASKED, None):
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


def serve(wire: Wire, *, niceness: int, main: tuple[str, str] | None) -> None:
    """A worker process's life: jobs until the node says ``EXIT`` or goes away. ``main``:
    where the node's main module is, imported only for a job whose function lives there."""
    global _traced
    if niceness:
        with contextlib.suppress(OSError):  # the service's own threads come first for a core
            os.nice(niceness)
    install_log_context()
    number = 0
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_ToNode(wire, lambda: number))
    found: dict[tuple[str, str], Callable[..., Any]] = {}
    while True:
        try:
            kind, number, body = wire.receive()
            if kind not in (JOB, JOB_IN_MAIN):
                if kind == EXIT:
                    return
                raise Unreadable(f"a frame of kind {kind} where a job was due")
        except (EOFError, OSError):
            return
        except Unreadable:
            os._exit(UNREADABLE)
        try:
            if kind == JOB_IN_MAIN and main is not None and not _main_loaded:
                load_main(main)
            job: Job = pickle.loads(body)
        except BaseException as exc:  # arguments that pickled in the node but do not load here
            _answer(wire, number, RAISED, raised(exc, "while its worker process read the job"))
            continue
        root.setLevel(job.log_level)
        mark = enter(_Running(job.task_id, job.name, job.bucket, _Attempt(job.attempt)))
        _traced = _trace(job.trace_context)
        signals = ChildSignals(wire, number, job.task_id, job.upstream)
        try:
            where = (job.module, job.qualname)
            func = found.get(where)
            if func is None:
                func = found[where] = locate(job.module, job.qualname)
            result = func(CancellationToken(signals), *job.args, **job.kwargs)
        except BaseException as exc:
            reply: tuple[int, Any] = (RAISED, raised(exc))
        else:
            reply = (RETURNED, result)
        finally:
            signals.over()
            if _traced is not None:
                _traced.close()
                _traced = None
            leave(mark)
        _answer(wire, number, *reply)


def _answer(wire: Wire, number: int, kind: int, body: Any) -> None:
    """Send the job's answer; a result that does not pickle is sent as the error it is."""
    try:
        wire.send(kind, number, body)
    except (EOFError, OSError):
        os._exit(0)  # the node is gone: nobody to answer
    except Exception as exc:
        failed = TypeError(f"its result cannot cross back: {exc}")
        wire.send(RAISED, number, raised(failed))
