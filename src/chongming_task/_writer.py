"""``Writer``: writes what the workers' runs transition, behind the workers.

On a store with group commit, a worker does not wait for its own writes: the start of a
run (``queued -> starting -> running``) and its end go to this thread, with the run's
write lock (taken without waiting, under the run's state lock) handed over with them.
The worker calls the task's function, or takes its next run, at once. The writer drains
everything queued into one store call (``persist_together``: one statement and one
commit on a store with group commit), so four workers' starts and ends share commits
instead of each waiting for its own.

What a caller is told does not loosen:

- ``wait()`` and ``result()`` return once the run's end is in the store (the writer ends
  the run after writing it, as the worker did);
- a control call (stop, pause, resume, cancel) from any thread writes its own transition
  and returns once it is in the store: it waits for the run's write lock, and whoever
  holds that lock writes everything queued before letting go (``TaskRun._let_go``);
- every transition reaches the trail, in order: a run has at most one write queued here
  or in flight (the write lock), and what it transitions meanwhile joins it.

What does loosen: while a run's start is in flight its function may already be running,
so a reader of the store sees ``queued`` for the time of one commit. Were the node to die
in that window, the task is active in the store under a dead lease and ``reconcile()``
marks it ``lost``: "outcome unknown", which is the truth.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from ._writethrough import persist_together
from .stores._hints import let_writes_wait

if TYPE_CHECKING:
    from ._carrier import Taken
    from .run import TaskRun

__all__ = ["Writer"]

log = logging.getLogger("chongming_task.writer")


class Writer:
    """One thread that writes the runs handed to it, all that is queued at once."""

    name = "chongming-writer"

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[tuple[TaskRun, Taken]] = deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._gone = False  # the thread has drained the queue and ended

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        with self._cond:
            if self._thread is not None or self._stopping:
                return
            # Daemon, like every service thread: the exit hook closes the node, which
            # drains and joins it first.
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def put(self, run: TaskRun, taken: Taken) -> None:
        """Write ``taken`` (``run``'s write lock held: the writer lets go of it). Once
        the writer has ended (or before it started), written here and now."""
        with self._cond:
            if not self._gone and self._thread is not None:
                self._queue.append((run, taken))
                if len(self._queue) == 1:
                    self._cond.notify()
                return
        run._write_held(taken)

    def stop(self) -> None:
        """End once everything queued is written."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def join(self, timeout: float | None) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        let_writes_wait()  # nobody waits on these writes as a caller of submit does
        queue = self._queue
        while True:
            with self._cond:
                while not queue:
                    if self._stopping:
                        self._gone = True
                        return
                    self._cond.wait()
            # Woken by the first write: let the threads that hold the interpreter run on
            # before taking the batch, so it carries what they queue meanwhile (a loop of
            # submit: 2.4 runs a batch became 5-6, commits a task 1.4 became 1.2).
            time.sleep(0)
            with self._cond:
                batch = list(queue)
                queue.clear()
            self._write(batch)

    def _write(self, batch: list[tuple[TaskRun, Taken]]) -> None:
        # What each run transitioned since it was queued joins its write (a quick task's
        # end, its start): one write of the latest snapshot, every transition in order.
        writes = [(run, run._take_more(taken)) for run, taken in batch]
        try:
            persist_together([(run._wt, snapshot, pending) for run, (pending, snapshot) in writes])
        except Exception:  # a store failure never gets here (each write keeps its own)
            log.exception("the writer failed to write %d run(s)", len(writes))
        for run, (_, snapshot) in writes:
            try:
                more = run._written_held(snapshot)
            except Exception:  # a waiter's callback, say: the run let go of its lock
                log.exception("task %s: after its write", run.task_id)
                continue
            if more is not None:  # transitioned while written: the lock stays, it goes next
                with self._cond:
                    self._queue.append((run, more))
