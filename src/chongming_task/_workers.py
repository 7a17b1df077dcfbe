"""``WorkerPool``: the carrier threads that run a node's tasks, one attempt at a time.

A worker takes the next run from the dispatcher and executes it. A carrier whose task
timed out and ignored its stop is abandoned (threads cannot be killed): its slot is
freed and a fresh worker replaces it, so the pool keeps its size. With ``overlap`` (a
store with group commit), a worker whose next run is already waiting hands a successful
run's end write to its closer thread and starts that run meanwhile (``_Closer``).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from ._registry import RunRegistry
from .run import carrier_crashed, execute

if TYPE_CHECKING:
    from ._dispatch import Dispatcher
    from .run import TaskRun

__all__ = ["WorkerPool"]

log = logging.getLogger("chongming_task.workers")

T = TypeVar("T")


class WorkerPool:
    def __init__(
        self, *, registry: RunRegistry, dispatcher: Dispatcher, size: int, overlap: bool = False
    ) -> None:
        self.name = "chongming-workers"
        self._overlap = overlap
        self._registry = registry
        self._dispatcher = dispatcher
        self._size = size
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._seq = 0
        self._stopping = False

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
        thread = threading.Thread(
            target=self._work, name=f"chongming-worker-{self._seq}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def abandon(self, run: TaskRun) -> None:
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

    def _work(self) -> None:
        registry, dispatcher = self._registry, self._dispatcher
        closer = _Closer(registry, dispatcher) if self._overlap else None
        try:
            while True:
                run = dispatcher.get()
                if run is None:
                    return
                registry.started(run)
                end = _carried(run, partial(execute, run, closer is not None))
                if run.abandoned:
                    return  # abandon() released the slot and started a replacement carrier
                if end is not None and closer is not None:
                    if dispatcher.ready():  # the next run waits: its start beside this end
                        closer.hand(run, end)
                        continue
                    _carried(run, end)  # nothing to overlap with: no thread hop
                registry.finished(run)
                dispatcher.done(run)
        finally:
            if closer is not None:
                closer.stop()


_ENDS_AHEAD = 4
"""Ended runs of one worker whose end write may wait at its closer. With one, a worker
whose previous end was still on its way (a statement slower than the next run's start)
waited for it; a few absorb that jitter. Postgres, prefilled as in
bench/postgres_throughput.py, 4,000 jobs, 4 workers, alternating: 1,573-1,807 jobs/s
with one, 1,921-2,191 with four; two and eight measured alike to four."""


class _Closer:
    """Writes the end of a worker's run on a thread of its own while the worker starts
    its next run, so the two writes overlap: on a store a round trip away they share a
    group commit, or at least run side by side. Up to ``_ENDS_AHEAD`` ends wait their
    turn, written in the order the runs ended; a worker with that many waits for the
    oldest. The run is finished (its waiters released, its slot freed) only once its end
    is written."""

    def __init__(self, registry: RunRegistry, dispatcher: Dispatcher) -> None:
        self._registry = registry
        self._dispatcher = dispatcher
        self._free = threading.Semaphore(_ENDS_AHEAD)
        self._queue: queue.SimpleQueue[tuple[TaskRun, Callable[[], None]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    def hand(self, run: TaskRun, end: Callable[[], None]) -> None:
        self._free.acquire()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"{threading.current_thread().name}-closer", daemon=True
            )
            self._thread.start()
        self._queue.put((run, end))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            run, end = item
            try:
                _carried(run, end)
            finally:
                self._registry.finished(run)
                self._dispatcher.done(run)
                self._free.release()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()


def _carried(run: TaskRun, step: Callable[[], T]) -> T | None:
    """``step()`` of carrying ``run`` (its attempt, or its end's write); if the runtime
    itself fails there, the task is ended ``failed`` (``None`` returned), never left
    active with nobody to finish it."""
    try:
        return step()
    except BaseException as exc:
        log.exception("task %s: carrier crashed", run.task_id)
        carrier_crashed(run, exc)
        return None
