"""``ProcessPool``: the worker processes a node owns for its ``carrier="process"`` tasks
(docs/design.md, "Process carriers").

A node's worker thread carries a process task's attempt as it carries a thread task's,
but the function runs in a worker process: the thread sends the job, then serves the
child's requests on the run's own signals (a checkpoint records the heartbeat and
progress here, raises the stop, holds while paused) until the child answers with what
the function returned or raised. The processes are started with ``forkserver`` (never a
plain ``fork`` of the threaded node), kept warm and reused, and replaced after
``max_tasks_per_process`` tasks or once a task leaves one holding more than
``max_memory_per_process`` bytes. Force is honest: a run whose stop or timeout grace ran
out has its child terminated (``SIGTERM``, then ``SIGKILL`` after ``kill_grace``), and
the task ends as asked with ``carrier_may_run=False``; a child that dies on its own
fails its task ``crashed``, naming the signal or exit code.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CarrierCrashed, StopRequested
from ..health import WorkerProcesses
from ..run.child import Job, Raised, serve

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from ..run.life import Run

__all__ = ["ProcessPool", "RaisedInChild"]

log = logging.getLogger("chongming_task.processes")

KILL_GRACE = 1.0
"""Seconds a terminated worker process has to exit before it is killed."""


class RaisedInChild(Exception):
    """What a task raised in its worker process, where the exception itself could not
    cross back: its type's name and message; the child's traceback is its ``__notes__``."""


class _Child:
    """One worker process and the node's ends of its two pipes."""

    __slots__ = ("alive", "conn", "killed", "process", "suspended", "tasks")

    def __init__(self, context: BaseContext) -> None:
        conn, child_conn = context.Pipe()
        watched, alive = context.Pipe(duplex=False)
        self.process: BaseProcess = context.Process(  # type: ignore[attr-defined]
            target=serve, args=(child_conn, watched), name="chongming-task worker", daemon=True
        )
        self.process.start()
        child_conn.close()  # its end, closed here: the child's death reads as EOF
        watched.close()
        self.alive = alive  # open while the node lives: the child exits once it closes
        self.conn = conn
        self.tasks = 0
        self.killed = False
        self.suspended = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def retire(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(KILL_GRACE)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(KILL_GRACE)
        self._close()

    def _close(self) -> None:
        self.conn.close()
        self.alive.close()

    def ended(self) -> str:
        """How the process ended, in words (it has, or is about to)."""
        self.process.join(KILL_GRACE)
        code = self.process.exitcode
        self._close()
        if code is None:
            return "it stopped answering"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name}"
        return f"exit code {code}"


class ProcessPool:
    """At most ``size`` worker processes, started on first use and reused."""

    def __init__(
        self,
        size: int,
        *,
        start_method: str = "forkserver",
        max_tasks_per_process: int | None = None,
        max_memory_per_process: int | None = None,
        kill_grace: float = KILL_GRACE,
    ) -> None:
        self.size = size
        self._context = multiprocessing.get_context(start_method)
        self._max_tasks = max_tasks_per_process
        self._max_memory = max_memory_per_process
        self._kill_grace = kill_grace
        self._lock = threading.Lock()
        self._free = threading.Semaphore(size)
        self._idle: list[_Child] = []
        self._carrying: dict[str, _Child] = {}  # task id -> its child
        self._closed = False
        self.started = 0
        """Worker processes started (replacements included)."""
        self.crashed = 0
        """Worker processes that died on their own while they carried a task."""

    def call(self, run: Run) -> Any:
        """Run one attempt of ``run``'s function in a worker process, serving its
        token's requests on this thread; what it returned, or raise what it raised."""
        definition = run.definition
        args, kwargs = run.arguments
        signals = run.signals
        job = Job(
            module=definition.func.__module__,
            qualname=definition.func.__qualname__,
            args=args,
            kwargs=kwargs,
            upstream=dict(signals.upstream),
            task_id=run.task_id,
            name=definition.name,
            attempt=signals.attempt,
            bucket=run.bucket,
            log_level=logging.getLogger().getEffectiveLevel(),
        )
        self._free.acquire()
        child = None
        try:
            if signals.stop_kind is not None:  # stopped while it waited for a worker
                raise StopRequested(f"task {run.task_id}: stop requested")
            child = self._take()
            with self._lock:
                self._carrying[run.task_id] = child
            child.conn.send(job)
            return self._serve(run, child)
        finally:
            with self._lock:
                self._carrying.pop(run.task_id, None)
            if child is not None:
                self._give_back(child)
            self._free.release()

    def _serve(self, run: Run, child: _Child) -> Any:
        signals = run.signals
        conn = child.conn
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                how = child.ended()
                if child.killed:  # terminated for its stop or timeout
                    raise StopRequested(f"worker process {child.pid} terminated ({how})") from None
                with self._lock:
                    self.crashed += 1
                raise CarrierCrashed(f"its worker process {child.pid} died: {how}") from None
            kind = message[0]
            if kind == "log":  # one-way: handled here, as a record made on this thread
                record = logging.makeLogRecord(message[1])
                logging.getLogger(record.name).handle(record)
                continue
            if kind == "returned":
                child.tasks += 1
                return message[1]
            if kind == "raised":
                child.tasks += 1
                raise _rebuilt(message[1])
            answer: Any = None
            try:
                if kind == "checkpoint":
                    signals.checkpoint(message[1])
                elif kind == "sleep":
                    signals.sleep(message[1])
                elif kind == "stop_requested":
                    answer = signals.stop_kind is not None
            except StopRequested as exc:
                answer = ("stop", str(exc))
            except Exception as exc:  # progress the store could not hold: raised in the task
                answer = ("error", exc)
            with contextlib.suppress(OSError):  # it died meanwhile: the next recv says how
                conn.send(answer)

    def _take(self) -> _Child:
        with self._lock:
            if self._closed:
                raise RuntimeError("the node's worker processes are closed")
            if self._idle:
                return self._idle.pop()
            self.started += 1
        return _Child(self._context)

    def _give_back(self, child: _Child) -> None:
        if child.killed or child.conn.closed or not child.process.is_alive():
            # Dead, or terminated (its task may have ended as the signal was sent):
            # never reused; the next call starts a fresh one.
            if not child.conn.closed:
                child.ended()
            return
        spent = (self._max_tasks is not None and child.tasks >= self._max_tasks) or (
            self._max_memory is not None and _resident(child) > self._max_memory
        )
        with self._lock:
            keep = not spent and not self._closed
            if keep:
                self._idle.append(child)
        if not keep:
            child.retire()

    def terminate(self, run: Run) -> bool:
        """End the worker process carrying ``run`` (its stop or timeout grace ran out):
        ``SIGTERM``, then ``SIGKILL`` after ``kill_grace``. Whether one was carrying it."""
        with self._lock:
            child = self._carrying.get(run.task_id)
        if child is None or child.killed:
            return child is not None
        child.killed = True
        log.info("task %s: terminating its worker process %s", run.task_id, child.pid)
        if child.suspended:  # a stopped process would hold its SIGTERM until continued
            _signal(child, signal.SIGCONT)
            child.suspended = False
        child.process.terminate()
        timer = threading.Timer(self._kill_grace, _kill_if_alive, args=(child.process,))
        timer.daemon = True
        timer.start()
        return True

    def suspend(self, run: Run) -> int | None:
        """Stop the worker process carrying ``run`` where it stands (SIGSTOP): a pause
        it did not reach at a checkpoint. Its pid, or ``None`` if none carries it."""
        with self._lock:
            child = self._carrying.get(run.task_id)
        if child is None or child.killed:
            return None
        if not child.suspended and _signal(child, signal.SIGSTOP):
            child.suspended = True
            log.info("task %s: suspended its worker process %s", run.task_id, child.pid)
        return child.pid if child.suspended else None

    def carry_on(self, run: Run) -> None:
        """Continue the suspended worker process of ``run`` (SIGCONT)."""
        with self._lock:
            child = self._carrying.get(run.task_id)
        if child is not None and child.suspended:
            child.suspended = False
            _signal(child, signal.SIGCONT)

    def counts(self) -> WorkerProcesses | None:
        """How its worker processes stand (``None`` before it started any)."""
        with self._lock:
            if not self.started:
                return None
            return WorkerProcesses(
                busy=len(self._carrying),
                idle=len(self._idle),
                started=self.started,
                crashed=self.crashed,
            )

    def close(self) -> None:
        """Retire the idle worker processes; those still carrying a task are killed."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = list(self._carrying.values())
        for child in idle:
            child.retire()
        for child in busy:
            child.killed = True
            child.process.kill()


def _resident(child: _Child) -> int:
    """Bytes of memory ``child`` holds now (its resident set; 0 where it cannot be read)."""
    try:
        pages = int(Path(f"/proc/{child.pid}/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * _PAGE


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _signal(child: _Child, sent: signal.Signals) -> bool:
    """Send ``sent`` to ``child``; whether it was there to get it."""
    pid = child.pid
    if pid is None:
        return False
    try:
        os.kill(pid, sent)
    except ProcessLookupError:
        return False
    return True


def _kill_if_alive(process: BaseProcess) -> None:
    if process.is_alive():
        process.kill()


def _rebuilt(raised: Raised) -> BaseException:
    """The exception to record for what the child raised, its traceback attached."""
    exc = raised.exception
    if exc is None:
        exc = RaisedInChild(f"{raised.type_name}: {raised.message}")
    exc.add_note(f"in its worker process:\n{raised.traceback.rstrip()}")
    return exc
