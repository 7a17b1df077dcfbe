"""``BehindWriter``: on a store that commits side-by-side writes together (SQLite,
PostgreSQL), the workers' runs' starts and ends are written behind the workers, who never
wait for them. Its docstring says what a caller is told and what loosens.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..loops import Pass, ThreadWatch, keep_running
from .writes import RunWrites, Taken

if TYPE_CHECKING:
    from ..model import TaskSnapshot, Transition
    from ..stores.roles import LifeWrite, PendingWrites

__all__ = ["BehindWriter"]

log = logging.getLogger("chongming_task.writer")

MAX_LAG = 0.005
"""Seconds a write queued behind may wait for its commit while runs wait in the
dispatcher: past it, a worker handing over the next write commits the queued ones if
the store is free, else lets the committing thread have the interpreter's lock, up to
this long again (a store that holds its writes for longer does not hold the workers:
their functions run on).

Busy workers keep the interpreter's lock: in a burst, the thread committing their
writes waited for it for as long as they had work (a commit of 256 writes took 86-237
ms instead of 7), and a success reached the store 125-175 ms after its function ended
at p99 in about half the runs (bench/durable.py, 4,000 no-ops at once, alternating
rounds); with a catch-up after 10 ms, 21-25 ms in every run, at 7,375-7,811 tasks/s
against 7,522-9,486. On PostgreSQL a commit under a busy interpreter takes 11-17 ms,
and after 10 ms the p99 was 47-61 ms; after 5 ms it is 29-33 ms at 4,451-4,707
tasks/s against 4,888-5,190 (SQLite: 15-20 ms against 23-25, at the same rate)."""

YIELD = 0.0005
"""How long a worker sleeps, between looks, while it lets a commit catch up."""


class _WriterThread:
    """The writer's thread: its start, stop and join."""

    name = "chongming-writer"
    thread_watch: ThreadWatch | None = None
    """Told when the thread dies and is started again (a node's health)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._gone = False  # the thread has drained what it had: put() writes itself

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        with self._cond:
            if self._thread is not None or self._stopping:
                return
            # Daemon, like every service thread: the exit hook closes the node, which
            # drains and joins it first.
            target = keep_running(
                "writer", self._loop, stopping=lambda: self._stopping, watch=self.thread_watch
            )
            self._thread = threading.Thread(target=target, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End once everything handed over is written."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def join(self, timeout: float | None) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        raise NotImplementedError

    def run_once(self, now: float | None = None) -> Pass:
        """One pass: what is pending written (a test drives it with no thread)."""
        raise NotImplementedError


Behind = tuple["PendingWrites", RunWrites, tuple["Transition", ...], "TaskSnapshot"]
"""A write queued behind: the store's handle, the run, its transitions, its snapshot."""


class BehindWriter(_WriterThread):
    """On a store that queues writes without waiting (``BatchedWrites``: SQLite,
    PostgreSQL), a worker writes its run's start and end itself and never waits, and no
    thread is woken for them.

    - A worker leaves its run's start queued (the run's write lock free) and calls the
      function. A quick task's end joins it: the worker takes both (``take_if_free``)
      and queues them as one write behind (``put``), commits it at once if the store is
      free and no run waits in the dispatcher, and takes its next run.
    - A queued write rides the next commit anyone makes: on a loop of ``submit``, the
      next task's create. Whoever wakes next ends the runs whose writes are committed
      (``complete``): the worker woken for the next run, or the caller of ``put``.
    - This class's thread is the backstop, looking every ``TICK`` while anything is
      pending and sleeping otherwise: a start left queued ``HAND_OVER`` (the function
      still running) it takes and writes; a write nobody's commit carried for
      ``HAND_OVER`` it commits; settled writes it ends.

    What a caller is told does not loosen: ``wait()`` returns once the run's end is in
    the store (the run is ended once its write is committed), a control call writes its
    own transition (and any start still queued) and returns once they are stored, and
    every transition reaches the trail in order (one write queued or in flight a run,
    under its write lock).

    What loosens: a reader of the store sees a running task ``queued`` until its start
    is written, up to ``HAND_OVER`` and a tick and a commit (about 6 ms). Were the node
    to die meanwhile, the task is active under a dead lease and ``reconcile()`` marks it
    ``lost``, "outcome unknown", which is the truth.

    Why: a writer thread taking every run's writes (a batch a store call) woke for
    every run's start, and again when the commit carrying it landed; on a loop of
    ``submit`` each wake came while the submitting thread waited for the interpreter's
    lock. Here one worker wakes a run: per-call ``submit`` on SQLite went from
    4,605-5,896 to 6,038-6,818 tasks/s (``bench/throughput.py``, alternating runs).
    """

    joins_start = True
    """A worker leaves a run's start queued, to join its end (``watch``)."""

    TICK = 0.005
    """How often the thread looks while anything is pending: each look holds the
    interpreter's lock a moment (at 1 ms, per-call ``submit`` was ~8 % slower)."""
    HAND_OVER = 0.001
    """How long a start or a write may be left for its worker or a caller's commit."""

    def __init__(
        self,
        write_behind: Callable[[Sequence[LifeWrite]], PendingWrites],
        *,
        backlog: Callable[[], bool],
    ) -> None:
        """``write_behind`` is the store's ``write_transitions_behind``; ``backlog``
        says whether runs wait in the dispatcher (a worker then leaves its write to ride
        with the next ones)."""
        super().__init__()
        self._write_behind = write_behind
        self._backlog = backlog
        self._pending: deque[Behind] = deque()  # queued writes; leave once settled
        self._starts: dict[RunWrites, float] = {}  # starts left queued, since when
        self._completing = threading.Lock()
        self._idle = False  # the thread sleeps until something is pending

    @property
    def pending(self) -> int:
        """Writes queued behind and not yet seen settled."""
        return len(self._pending)

    def watch(self, writes: RunWrites) -> None:
        """The run's start is queued and its write lock free: written by whoever takes
        it first, its worker (with the end) or this thread (past ``HAND_OVER``)."""
        with self._cond:
            if self._thread is None or self._gone:
                unwatched = True
            else:
                unwatched = False
                self._starts[writes] = time.monotonic()
                if self._idle:
                    self._cond.notify()
        if unwatched:  # no thread to look after it: written here and now
            writes.write()

    def put(self, writes: RunWrites, taken: Taken) -> None:
        """Write ``taken`` (the run's write lock held, let go once it is written):
        queued behind, not waited for."""
        if self._thread is None:  # not started: written here and now
            writes.write_taken(taken)
            return
        self._starts.pop(writes, None)  # its start (if left queued) is taken: in here
        pending, snapshot = writes.take_more(taken)
        entry: Behind | None = None
        if writes.shares(snapshot):
            try:
                handle = self._write_behind([(snapshot, writes.expected_version, pending)])
            except Exception:  # refused as a whole (a value it cannot bind, say): alone
                log.exception("task %s: its write was not queued; written alone", writes.task_id)
            else:
                entry = (handle, writes, pending, snapshot)
        if entry is None:  # desynced, buffered, or nothing new: written alone, here
            writes.persist(snapshot, pending)
            self._written(writes, snapshot)
            return
        with self._cond:
            queued = not self._gone
            if queued:
                self._pending.append(entry)
                if self._idle:
                    self._cond.notify()
        if not queued:  # the thread has ended (close): seen through here
            entry[0].wait()
            self._settle(entry)
            return
        if not self._backlog():
            entry[0].serve()  # nobody's commit is coming soon: commit now if the store is free
        else:
            late = self._overdue()
            if late is not None:
                self._catch_up(late)
        self.complete()

    def _catch_up(self, late: PendingWrites) -> None:
        """Commit ``late`` if the store is free; else let whoever is committing have the
        interpreter's lock, ``MAX_LAG`` at most."""
        deadline = time.monotonic() + MAX_LAG
        while True:
            late.serve()
            if late.settled or time.monotonic() >= deadline:
                return
            time.sleep(YIELD)

    def _overdue(self) -> PendingWrites | None:
        """The oldest write still uncommitted, if it has waited ``MAX_LAG`` (looked for
        by index near the head: other threads append meanwhile, and the settled ones
        leave at the next ``complete``)."""
        pending = self._pending
        try:
            for at in range(min(len(pending), 8)):
                handle = pending[at][0]
                if not handle.settled:
                    late = time.monotonic() - handle.queued_at >= MAX_LAG
                    return handle if late else None
        except IndexError:  # completed meanwhile
            pass
        return None

    def complete(self, *, whole: bool = False) -> None:
        """End the runs whose writes are settled, the oldest first, up to the first
        write still pending (any thread: a worker calls it when it takes a run and
        after queuing a write); ``whole``: every settled one, past writes still
        pending (this class's thread, each look: one write held up holds up the runs
        queued after it for a ``TICK`` at most). Another thread completing: nothing to
        do.

        Why the head only: writes settle about in the order they were queued, and a
        look at every entry on each call cost a worker the whole queue a task (a burst
        on PostgreSQL, where ~100 writes wait for each commit: 5,132-5,150 tasks/s
        looking at every entry, 5,547-7,071 at the head)."""
        if not self._pending or not self._completing.acquire(False):
            return
        try:
            self._complete_held(whole)
        finally:
            self._completing.release()

    def _complete_held(self, whole: bool) -> None:
        """``complete()``, holding ``_completing``. An entry leaves the queue only here
        and only once settled: the queue is never empty while a write is pending (the
        thread sleeps on an empty one)."""
        pending = self._pending
        while pending and pending[0][0].settled:
            self._settle(pending.popleft())
        if whole and pending:
            for entry in list(pending):
                if entry[0].settled:
                    pending.remove(entry)
                    self._settle(entry)

    def _settle(self, entry: Behind) -> None:
        handle, writes, pending, snapshot = entry
        (error,) = handle.errors()
        if not writes.settle(snapshot, error, len(pending), False):
            writes.keep(pending)
        self._written(writes, snapshot)

    def _written(self, writes: RunWrites, snapshot: TaskSnapshot) -> None:
        """``snapshot`` is written (or buffered): the run ends if it is terminal, and
        lets go of its write lock, or writes next what it transitioned meanwhile."""
        try:
            more = writes.written(snapshot)
        except Exception:  # a waiter's callback, say: the run let go of its lock
            log.exception("task %s: after its write", writes.task_id)
            return
        if more is not None:
            self.put(writes, more)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._pending or self._starts or self._stopping):
                    self._idle = True
                    self._cond.wait()
                self._idle = False
                if self._stopping:
                    break
                self._cond.wait(self.TICK)  # stop() cuts it short
            try:
                self.run_once()
            except Exception:  # a step that raises is logged; the loop goes on
                log.exception("the writer's pass failed")
        self._drain()

    def run_once(self, now: float | None = None) -> Pass:
        """One look at monotonic ``now`` (the time when ``None``): ``_look``; ``done``:
        the starts handed over and the writes committed on their own."""
        return Pass(done=self._look((time.monotonic() if now is None else now) - self.HAND_OVER))

    def _look(self, due: float) -> int:
        """One pass: write the starts left queued since before ``due``, commit the
        writes queued since before it, end the runs whose writes are committed.
        Returns how many starts and commits it made."""
        made = 0
        starts = self._starts
        for writes, since in list(starts.items()):
            if since <= due and starts.pop(writes, None) is not None:  # not taken meanwhile
                self._hand_over(writes)
                made += 1
        for handle, *_ in list(self._pending):
            if not handle.settled and handle.queued_at <= due:
                handle.serve()  # one commit takes every write queued; the store busy,
                made += 1  # whoever has it commits them as it lets go
                break
        self.complete(whole=True)
        return made

    def _hand_over(self, writes: RunWrites) -> None:
        """Write the run's queued start, if nobody took it yet (its worker, with the end;
        a control call, with its own)."""
        taken = writes.take()
        if taken is not None:
            self.put(writes, taken)

    def _drain(self) -> None:
        """Stopping: write every start left queued and see every pending write through;
        from now on ``put`` and ``watch`` write on their caller's thread."""
        with self._cond:
            self._gone = True
            starts = list(self._starts)
            self._starts.clear()
        for writes in starts:
            self._hand_over(writes)
        pending = self._pending  # only shrinks now: put() writes on its caller's thread
        with self._completing:
            while pending:
                left = len(pending)
                for handle, *_ in list(pending):
                    handle.wait()
                self._complete_held(True)
                if len(pending) == left:  # a store whose wait() returned unsettled
                    log.error("%d write(s) never settled; their runs are not ended", left)
                    return
