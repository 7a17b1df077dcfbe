"""``ProcessPool``: the worker processes a node owns for its ``carrier="process"`` tasks
(docs/design.md, "Process carriers").

Each of the pool's slots is a thread of the node that carries a process task's attempt
as a worker thread carries a thread task's, but the function runs in the slot's worker
process: the thread sends the job, then serves the child's requests on the run's own
signals (a checkpoint records the heartbeat and progress here, raises the stop, holds
while paused) until the child answers with what the function returned or raised; a
frame that is not one, or not of the job it sent, ends that worker before anything else
is sent to it. The processes are forked by the node's fork server (``forkserver.py``),
kept warm and reused, and replaced after ``max_tasks_per_process`` tasks or once a task
leaves one holding more than ``max_memory_per_process`` bytes. Force is honest: a run
whose stop or timeout grace ran out has its child terminated with the processes its task
started (``SIGTERM``, then ``SIGKILL`` after ``kill_grace``), and the task ends as asked
with ``carrier_may_run=False``, saying so; a child that dies on its own fails its task
``crashed``, naming the signal or exit code.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import queue
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import observe
from ..current import enter, leave
from ..errors import CarrierCrashed, CarrierTerminated, StopRequested
from ..health import WorkerProcesses
from ..loops import ThreadWatch, keep_running
from ..run import child as wire
from ..run.child import Job, Raised, Unreadable, load
from .dispatch import Lane
from .forkserver import ForkServer, Worker
from .workers import attempt, crashed

if TYPE_CHECKING:
    from ..run.life import Run

__all__ = ["ProcessPool", "RaisedInChild"]

log = logging.getLogger("chongming_task.processes")

KILL_GRACE = 1.0
"""Seconds a terminated worker process has to exit before it is killed."""


class RaisedInChild(Exception):
    """What a task raised in its worker process, where the exception itself could not
    cross back: its type's name and message; the child's traceback is its ``__notes__``."""


class _Child:
    """One worker process, as its slot knows it."""

    __slots__ = ("dead", "job", "killed", "reached", "suspended", "tasks", "worker")

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.job = 0  # the number of the last job sent: every frame back must carry it
        self.tasks = 0
        self.killed = False  # terminated by the node for a stop or timeout
        self.reached = 0  # processes its task had started that the termination reached
        self.suspended = False
        self.dead = False  # ended (or found dead): never sent anything again

    @property
    def pid(self) -> int:
        return self.worker.pid

    def retire(self, grace: float) -> None:
        """Asked to exit (killed if it has not within ``grace``)."""
        self.dead = True
        with contextlib.suppress(OSError):
            self.worker.wire.send(wire.EXIT, self.job)
        if self.worker.exit_code(grace) is None:
            self.worker.end(signal.SIGKILL)
            self.worker.exit_code(grace)
        self.worker.close()

    def ended(self, grace: float) -> str:
        """How the process ended, in words (it has, or it is ended now)."""
        self.dead = True
        code = self.worker.exit_code(grace)
        if code is None:
            self.worker.end(signal.SIGKILL)
            code = self.worker.exit_code(grace)
        self.worker.close()
        if code is None:
            return "it stopped answering"
        if code == wire.UNREADABLE:
            return "it could not read what the node sent it"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name}"
        return f"exit code {code}"

    def terminated(self) -> str:
        """What a forced end did, in the task's words."""
        also = (
            ""
            if not self.reached
            else f" with the {self.reached} process{'es' if self.reached > 1 else ''} "
            "its task had started"
        )
        return f"its worker process {self.pid} was terminated{also}"


class _Slot:
    """One place in the pool: the thread that carries its runs, and the worker process
    it carries them in (started on its first run, replaced when spent or dead)."""

    __slots__ = ("child", "used")

    def __init__(self) -> None:
        self.child: _Child | None = None
        self.used = False  # a process of its own was started before


class ProcessPool:
    """``size`` slots, each a thread of the node that carries one process task at a
    time in a worker process of its own.

    A process task is handed here (``hand``, from the dispatcher or a worker thread,
    never waiting) and waits in the pool's own queue, in priority order, for a free
    slot: it holds no worker thread while it waits, so thread tasks are never held
    behind process tasks, and it begins (``running``) once a slot takes it. The
    threads start with the first task handed; each slot's process with its first run.
    """

    def __init__(
        self,
        size: int,
        *,
        max_tasks_per_process: int | None = None,
        max_memory_per_process: int | None = None,
        kill_grace: float = KILL_GRACE,
        niceness: int = wire.NICENESS,
        main: tuple[str, str] | None = None,
    ) -> None:
        """``niceness``: how much lower the workers' CPU priority is than the node's;
        ``main``: where the program's ``__main__`` is, for a function defined there
        (``definitions.main_module``)."""
        self.size = size
        self.name = "chongming-processes"
        self._forks = ForkServer(niceness=niceness, main=main)
        self._max_tasks = max_tasks_per_process
        self._max_memory = max_memory_per_process
        self._kill_grace = kill_grace
        self._lock = threading.Lock()
        self._ready = Lane()  # handed runs, guarded by ``_lock``
        self._wakes: queue.SimpleQueue[None] = queue.SimpleQueue()  # one per run handed
        self._slots: list[_Slot] = []
        self._threads: list[threading.Thread] = []
        self._carrying: dict[str, _Slot] = {}  # task id -> the slot carrying it
        self._stopping = False
        self._closed = False
        self.started = 0
        """Worker processes started (replacements included)."""
        self.replaced = 0
        """Worker processes started in place of one retired, ended or dead."""
        self.crashed = 0
        """Worker processes that died on their own while they carried a task."""
        self.released: Callable[[Run], None] = _nothing
        """Told when a run handed here is done with (whatever its outcome)."""
        self.thread_watch: ThreadWatch | None = None
        """Told when a slot's thread dies and is started again (a node's health)."""

    # -- runs in ----------------------------------------------------------------------------------

    def hand(self, run: Run) -> None:
        """Carry ``run``'s attempt in a worker process (from any thread, never waiting)."""
        with self._lock:
            refused = self._stopping
            if not refused:
                self._ready.push(run)
                if not self._threads:
                    self._start_threads()
        if refused:  # handed after the node's close began: never left active
            crashed(run, RuntimeError("the node's worker processes are closed"))
            self.released(run)
            return
        self._wakes.put(None)

    def _start_threads(self) -> None:
        """Caller holds ``_lock``."""
        for at in range(self.size):
            slot = _Slot()
            self._slots.append(slot)
            target = keep_running(
                "processes",
                functools.partial(self._serve_slot, slot),
                stopping=lambda: self._stopping,
                watch=self.thread_watch,
            )
            thread = threading.Thread(
                target=target, name=f"chongming-process-slot-{at + 1}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _serve_slot(self, slot: _Slot) -> None:
        """A slot's thread: the runs handed here, one at a time, until the pool stops
        and nothing handed is left."""
        while True:
            self._wakes.get()
            with self._lock:
                run = self._ready.pop()
                if run is None:
                    if self._stopping:
                        return
                    continue
                self._carrying[run.task_id] = slot
            mark = enter(run)  # current(), and the attempt's log records, name the task
            try:
                attempt(run, functools.partial(self._call, slot))
            except BaseException as exc:
                crashed(run, exc)
            finally:
                leave(mark)
                with self._lock:
                    self._carrying.pop(run.task_id, None)
                self._settle(slot)
            self.released(run)

    # -- one attempt ------------------------------------------------------------------------------

    def _call(self, slot: _Slot, run: Run) -> Any:
        """Run one attempt of ``run``'s function in ``slot``'s worker process, serving
        its token's requests on this thread; what it returned, or raise what it raised."""
        definition = run.definition
        args, kwargs = run.arguments
        signals = run.signals
        job = Job(
            definition.func.__module__,
            definition.func.__qualname__,
            args,
            kwargs,
            dict(signals.upstream),
            run.task_id,
            definition.name,
            signals.attempt,
            run.bucket,
            logging.getLogger().getEffectiveLevel(),
            None if (watch := observe.watcher) is None else watch.trace_context(),
        )
        kind = wire.JOB_IN_MAIN if job.module == "__main__" else wire.JOB
        data = pickle.dumps(job, pickle.HIGHEST_PROTOCOL)
        child = self._child(slot)
        child.job += 1
        try:
            child.worker.wire.send_bytes(kind, child.job, data)
        except OSError:  # it died while idle (its end is closed): the job goes to a fresh one
            child.ended(self._kill_grace)
            slot.child = None
            child = self._child(slot)
            child.job += 1
            child.worker.wire.send_bytes(kind, child.job, data)
        try:
            return self._serve(run, child)
        except Unreadable as exc:
            # Its stream cannot be trusted from here on: the worker is ended before
            # anything else is sent to it, and the attempt says why.
            child.worker.end(signal.SIGKILL)
            how = child.ended(self._kill_grace)
            log.warning(
                "task %s: its worker process %s sent %s; ended (%s)",
                run.task_id,
                child.pid,
                exc,
                how,
            )
            raise CarrierCrashed(
                f"its worker process {child.pid} sent {exc}: it was ended before anything "
                "else was sent to it"
            ) from None

    def _child(self, slot: _Slot) -> _Child:
        """``slot``'s worker process, started if it has none."""
        child = slot.child
        if child is None:
            with self._lock:
                if self._closed:
                    raise RuntimeError("the node's worker processes are closed")
                self.started += 1
                self.replaced += slot.used
                slot.used = True
            child = slot.child = _Child(self._forks.fork())
        return child

    def _serve(self, run: Run, child: _Child) -> Any:
        """The worker's frames for its current job until its answer (``Unreadable``: a
        frame that is not one, or not this job's)."""
        signals = run.signals
        channel = child.worker.wire
        number = child.job
        while True:
            try:
                kind, job, body = channel.receive()
            except (EOFError, OSError):
                how = child.ended(self._kill_grace)
                if child.killed:  # terminated for its stop or timeout
                    raise CarrierTerminated(child.terminated()) from None
                with self._lock:
                    self.crashed += 1
                raise CarrierCrashed(f"its worker process {child.pid} died: {how}") from None
            if kind == wire.LOG and job <= number:  # one-way, perhaps from a thread left behind
                _handle_log(body, child.pid)
                continue
            if job != number:
                raise Unreadable(f"a frame of job {job} while it carried job {number}")
            if kind == wire.RETURNED:
                child.tasks += 1
                return load(body, "a result")
            if kind == wire.RAISED:
                child.tasks += 1
                raise _rebuilt(load(body, "an exception"))
            answer: Any = None
            try:
                if kind == wire.CHECKPOINT:
                    signals.checkpoint(load(body, "a checkpoint"))
                elif kind == wire.SLEEP:
                    signals.sleep(load(body, "a sleep"))
                elif kind == wire.STOP_ASKED:
                    answer = signals.stop_kind is not None
                else:
                    raise Unreadable(f"a frame of kind {kind}")
            except StopRequested as exc:
                answer = ("stop", str(exc))
            except Unreadable:
                raise
            except Exception as exc:  # progress the store could not hold: raised in the task
                answer = ("error", exc)
            with contextlib.suppress(OSError):  # it died meanwhile: the next receive says how
                channel.send(wire.ANSWER, number, answer)

    def _settle(self, slot: _Slot) -> None:
        """After a run: ``slot``'s process kept for the next one, or ended (dead,
        terminated, past its share of tasks or its memory line, or the pool closing)."""
        child = slot.child
        if child is None:
            return
        if child.killed or child.dead:
            # Terminated (its task may have ended as the signal was sent), or dead:
            # never reused; the slot's next run starts a fresh one.
            if not child.dead:
                child.ended(self._kill_grace)
            slot.child = None
            return
        spent = (self._max_tasks is not None and child.tasks >= self._max_tasks) or (
            self._max_memory is not None and _resident(child.pid) > self._max_memory
        )
        if spent:
            slot.child = None
            child.retire(self._kill_grace)

    # -- force, from other threads ----------------------------------------------------------------

    def _carrier(self, run: Run) -> _Child | None:
        with self._lock:
            slot = self._carrying.get(run.task_id)
            return None if slot is None else slot.child

    def terminate(self, run: Run) -> bool:
        """End the worker process carrying ``run`` (its stop or timeout grace ran out),
        with the processes its task started: ``SIGTERM``, then ``SIGKILL`` after
        ``kill_grace``. Whether one was carrying it."""
        child = self._carrier(run)
        if child is None or child.killed:
            return child is not None
        child.killed = True
        log.info("task %s: terminating its worker process %s", run.task_id, child.pid)
        if child.suspended:  # a stopped process would hold its SIGTERM until continued
            child.worker.end(signal.SIGCONT)
            child.suspended = False
        child.reached = child.worker.end(signal.SIGTERM)
        timer = threading.Timer(self._kill_grace, _kill_if_alive, args=(child,))
        timer.daemon = True
        timer.start()
        return True

    def suspend(self, run: Run) -> int | None:
        """Stop the worker process carrying ``run`` where it stands, with the processes
        its task started (SIGSTOP): a pause it did not reach at a checkpoint. Its pid,
        or ``None`` if none carries it."""
        child = self._carrier(run)
        if child is None or child.killed or child.dead:
            return None
        if not child.suspended:
            child.worker.end(signal.SIGSTOP)
            child.suspended = True
            # A signal is delivered, not obeyed, by the time kill() returns: the task is
            # said paused once the kernel shows its worker stopped.
            _until_stopped(child.pid, self._kill_grace)
            log.info("task %s: suspended its worker process %s", run.task_id, child.pid)
        return child.pid

    def carry_on(self, run: Run) -> None:
        """Continue the suspended worker process of ``run`` (SIGCONT)."""
        child = self._carrier(run)
        if child is not None and child.suspended:
            child.suspended = False
            child.worker.end(signal.SIGCONT)

    # -- the node's view, and its end -------------------------------------------------------------

    def counts(self) -> WorkerProcesses | None:
        """How its worker processes stand (``None`` before it started any)."""
        with self._lock:
            if not self.started:
                return None
            alive = sum(1 for slot in self._slots if slot.child is not None)
            busy = len(self._carrying)
            return WorkerProcesses(
                busy=busy,
                idle=max(0, alive - busy),
                started=self.started,
                replaced=self.replaced,
                crashed=self.crashed,
            )

    def start(self) -> None:
        """Nothing yet: the slots' threads start with the first run handed here, and
        each slot's worker process with its own first run (a node without process
        tasks starts neither)."""

    def stop(self) -> None:
        """Take no more runs; each slot ends once the runs handed before are carried."""
        with self._lock:
            self._stopping = True
            threads = len(self._threads)
        for _ in range(threads):
            self._wakes.put(None)

    def join(self, timeout: float | None) -> None:
        with self._lock:
            threads = list(self._threads)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)

    def close(self) -> None:
        """End every worker process: idle ones asked to exit, any still carrying a task
        killed with what its task started; then the fork server."""
        with self._lock:
            self._stopping = self._closed = True
            slots = list(self._slots)
            busy = {id(slot) for slot in self._carrying.values()}
        for slot in slots:
            child = slot.child
            if child is None or child.dead:
                continue
            if id(slot) in busy:
                child.killed = True
                child.worker.end(signal.SIGKILL)
            else:
                slot.child = None
                child.retire(self._kill_grace)
        self._forks.close()


def _nothing(run: Run) -> None:
    pass


def _resident(pid: int) -> int:
    """Bytes of memory process ``pid`` holds now (its resident set; 0 where it cannot
    be read)."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * _PAGE


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _until_stopped(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds until process ``pid`` is stopped (Linux: its
    ``/proc`` state; elsewhere, or once it is gone, at once)."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        if stat[stat.rfind(")") + 2] in "tTZX":
            return
        tick.wait(0.001)


def _kill_if_alive(child: _Child) -> None:
    if not child.dead:
        child.worker.end(signal.SIGKILL)


def _handle_log(body: bytes, pid: int) -> None:
    """A worker's log record, handled by the node's logging as a record made here. Its
    ``extra`` fields travel pickled apart: where they cannot be read, the record is
    handled without them and says so."""
    try:
        fields, kept = pickle.loads(body)
    except Exception as exc:
        fields = {
            "name": "chongming_task.processes",
            "levelno": logging.WARNING,
            "levelname": "WARNING",
            "msg": f"a log record from worker process {pid} cannot be read ({exc!r})",
        }
        kept = b""
    if kept:
        try:
            extra = pickle.loads(kept)
        except Exception as exc:
            fields["msg"] = (
                f"{fields.get('msg')} [its extra fields cannot be read in the node: {exc!r}]"
            )
        else:
            fields.update(extra)
    record = logging.makeLogRecord(fields)
    logging.getLogger(record.name).handle(record)


def _rebuilt(raised: Raised) -> BaseException:
    """The exception to record for what the child raised, its traceback attached."""
    exc: BaseException | None = None
    if raised.pickled is not None:
        try:
            exc = pickle.loads(raised.pickled)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = RaisedInChild(f"{raised.type_name}: {raised.message}")
    exc.add_note(f"in its worker process:\n{raised.traceback.rstrip()}")
    return exc
