"""``WorkerPool``: the carrier threads that run a node's tasks, one attempt at a time.

A worker takes the next run from the dispatcher and executes it. A carrier whose task
timed out and ignored its stop is abandoned (threads cannot be killed): its slot is
freed and a fresh worker replaces it, so the pool keeps its size. On a store with group
commit the worker's own writes (a run's start and end) go to the node's writer, and
the worker takes its next run while they are written; with a ``BehindWriter`` a worker
that wakes for a run first ends the runs whose writes have landed (``woken``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import observe
from ..current import enter, leave
from ..loops import Pass, ThreadWatch, keep_running
from .registry import RunRegistry

if TYPE_CHECKING:
    from ..run.life import Run
    from .dispatch import Dispatcher

__all__ = ["WorkerPool", "attempt", "crashed"]

log = logging.getLogger("chongming_task.workers")


class WorkerPool:
    def __init__(
        self,
        *,
        registry: RunRegistry,
        dispatcher: Dispatcher,
        size: int,
        woken: Callable[[], None] | None = None,
    ) -> None:
        """``woken`` is called by a worker each time it takes a run (a
        ``BehindWriter``'s ``complete``: it ends the runs whose writes are committed)."""
        self.name = "chongming-workers"
        self._registry = registry
        self._dispatcher = dispatcher
        self._woken = woken
        self._size = size
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._seq = 0
        self._stopping = False
        self.thread_watch: ThreadWatch | None = None
        """Told when a worker thread dies and is started again (a node's health)."""
        self.hand_async: Callable[[Run], None] | None = None
        """Where an ``async def`` task's attempt goes (the node's event loop)."""
        self.hand_process: Callable[[Run], None] | None = None
        """Where a process task's attempt goes (the node's worker processes)."""

    @property
    def started(self) -> bool:
        return bool(self._threads)

    def start(self) -> None:
        with self._lock:
            if self._threads or self._stopping:
                return
            for _ in range(self._size):
                self._spawn()

    def _spawn(self) -> None:
        """Caller holds ``_lock``."""
        self._seq += 1
        # Daemon: a carrier stuck in a task that ignores stop must not hang the
        # interpreter's exit; close() still joins every carrier it can.
        target = keep_running(
            "workers", self._work, stopping=lambda: self._stopping, watch=self.thread_watch
        )
        thread = threading.Thread(target=target, name=f"chongming-worker-{self._seq}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def abandon(self, run: Run) -> None:
        """A timed-out carrier ignored its stop: free its slot and start a new carrier."""
        self._registry.finished(run)
        self._dispatcher.done(run)
        with self._lock:
            if not self._stopping:
                self._spawn()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self._dispatcher.close()

    def join(self, timeout: float | None) -> None:
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout)

    def run_once(self, now: float | None = None) -> Pass:
        """Carry one run that may start now on the calling thread, if there is one
        (``done``: 1): what each worker does in a loop, without waiting (a test drives
        it with no thread)."""
        run = self._dispatcher.get_nowait()
        if run is None:
            return Pass()
        self._carry(run)
        return Pass(done=1)

    def _work(self) -> None:
        get = self._dispatcher.get
        while True:
            run = get()  # blocks until a run may start
            if run is None:
                return
            if not self._carry(run):
                return  # abandon() released the slot and started a replacement carrier

    def _carry(self, run: Run) -> bool:
        """One attempt of ``run``; ``False`` if its carrier was abandoned."""
        if self._woken is not None:
            self._woken()
        self._registry.started(run)
        if run.definition.off_workers:
            # The node's event loop or its worker processes carry it; its slot is
            # freed at its end.
            hand = self.hand_async if run.definition.is_async else self.hand_process
            if hand is not None:
                hand(run)
                return True
        mark = enter(run)  # current(), and the attempt's log records, name the task
        try:
            attempt(run)
        except BaseException as exc:
            crashed(run, exc)
        finally:
            leave(mark)
        if run.abandoned:
            return False
        self._registry.finished(run)
        self._dispatcher.done(run)
        return True


def attempt(run: Run, carry: Callable[[Run], Any] | None = None) -> None:
    """One attempt of a thread task, on the calling (worker) thread: its start
    recorded, its function called, its end recorded (``node.aio.attempt`` for
    ``async def`` ones). ``carry``: where the function runs instead (a process task's
    worker process, served from the calling slot thread)."""
    if not run.begin_attempt():
        return  # cancelled or stopped while it waited
    watch = observe.watcher
    seen = None if watch is None else watch.began(run)
    raised = None
    try:
        result = run.call() if carry is None else carry(run)
    except BaseException as exc:
        raised = exc
        run.ended_by(exc)
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt, SystemExit: recorded, then on their way
    else:
        run.settle(result)
    finally:
        if seen is not None:
            seen.ended(raised)


def crashed(run: Run, exc: BaseException) -> None:
    """The runtime itself failed while carrying ``run``: the task is ended ``failed``,
    never left active with nobody to finish it."""
    log.exception("task %s: carrier crashed", run.task_id)
    run.crashed(exc)
