"""The ready queue between ``submit`` and the worker threads.

Two shapes, one interface:

* ``FifoDispatcher`` (no per-bucket limit): first come, first served, so no bucket can
  starve another; each run wakes one parked worker.
* ``FairDispatcher`` (``max_parallel_per_bucket`` set): one FIFO per bucket, served
  round-robin, at most N running per bucket, so one tenant's backlog in one bucket does not
  starve another bucket.

Both serve higher priorities first, first come first served within one priority
(``Lane``). Priority is strict: a steady stream of higher-priority runs holds lower ones
back for as long as it lasts (docs/design.md, "When and in what order").

Both keep a definition's ``max_per_key`` (``KeyGate``): at most that many of its runs
sharing one concurrency key pass to the queue; the others wait at the gate, in priority
order, until one of theirs is done. The limit is this node's alone.

Retries and delayed tasks wait in a delay heap until their time, read from the
injectable clock; one due while a pause is asked of it waits, unstarted, until resumed.
One timer thread sleeps until the earliest is due and releases what is due: a waiting
run costs a heap entry, not a poll, so an idle node with 100,000 waiting tasks stays
idle. The supervisor releases due runs on every tick too, so a fake clock's advance is
noticed.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..clock import Clock
from ..loops import keep_running

if TYPE_CHECKING:
    from ..run.life import Run

__all__ = ["Dispatcher", "FairDispatcher", "FifoDispatcher", "make_dispatcher"]


class Dispatcher(Protocol):
    def put(self, run: Run) -> None: ...

    def schedule(self, run: Run, delay: float) -> None:
        """Make ``run`` ready after ``delay`` seconds (a retry's backoff)."""

    def get(self) -> Run | None:
        """Block until a run may start; ``None`` once closed."""

    def get_nowait(self) -> Run | None:
        """A run that may start now, or ``None`` (never waits)."""

    def backlog(self) -> bool:
        """Whether runs are ready and waiting for a worker (a moment's reading)."""

    def done(self, run: Run) -> None:
        """The carrier finished with ``run`` (whatever its outcome)."""

    def release_due(self) -> int:
        """Move retries whose backoff has passed to the ready queue; how many moved."""

    def close(self) -> None: ...


class Lane:
    """Runs in priority order, first come first served within one priority: a deque for
    each priority that has runs waiting, and the other priorities in descending order.
    Runs of priority 0, nearly all of them, go in ``plain``, which ``FifoDispatcher``
    reads and writes without a lock; the caller guards the rest.

    Why not one heap ranked by ``(-priority, arrival)``: each push and pop compared
    tuples down a tree as deep as the queue (twelve levels at 3,000 queued runs), and
    the in-memory row of bench/submit_options.py ran priority-1 runs at 0.90x of plain
    ones; a deque per priority pays an append and a popleft, as plain runs do."""

    __slots__ = ("_order", "plain", "ranked")

    def __init__(self) -> None:
        self.plain: deque[Run] = deque()
        self.ranked: dict[int, deque[Run]] = {}  # only priorities with runs waiting
        self._order: list[int] = []  # the keys of ``ranked``, highest first

    def __bool__(self) -> bool:
        return bool(self.plain or self.ranked)

    def push(self, run: Run) -> None:
        priority = run.priority
        if not priority:
            self.plain.append(run)
            return
        runs = self.ranked.get(priority)
        if runs is None:
            runs = self.ranked[priority] = deque()
            order = self._order
            at = 0  # few priorities wait at once: a walk, as bisect has no key in 3.11
            while at < len(order) and order[at] > priority:
                at += 1
            order.insert(at, priority)
        runs.append(run)

    def head(self) -> int | None:
        """The priority of the run ``pop`` takes next (``None``: empty)."""
        order = self._order
        if order and (order[0] > 0 or not self.plain):
            return order[0]
        return 0 if self.plain else None

    def pop(self) -> Run | None:
        """The next run (``None``: empty): a ranked run ahead of priority 0 if its
        priority is higher, behind it if lower."""
        order = self._order
        if order and (order[0] > 0 or not self.plain):
            first = order[0]
            runs = self.ranked[first]
            run = runs.popleft()
            if not runs:
                del self.ranked[first]
                order.pop(0)
            return run
        try:
            return self.plain.popleft()
        except IndexError:
            return None


class KeyGate:
    """At most ``max_per_key`` runs of one definition sharing a ``concurrency_key`` are
    past the gate (queued for a worker, or running); ``admit`` holds the others back,
    and ``release`` (a run past the gate is done) lets the next one of its key through.
    Runs without a limit or a key pass without a lock."""

    __slots__ = ("_lock", "_passed", "_waiting")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._passed: dict[tuple[str, str], int] = {}
        self._waiting: dict[tuple[str, str], Lane] = {}

    @staticmethod
    def _key(run: Run) -> tuple[str, str] | None:
        key = run.concurrency_key
        return None if key is None else (run.definition.name, key)

    def admit(self, run: Run) -> bool:
        """Whether ``run`` passes now; if not, it waits here for ``release``."""
        limit = run.definition.max_per_key
        key = None if limit is None else self._key(run)
        if limit is None or key is None:
            return True
        with self._lock:
            passed = self._passed.get(key, 0)
            if passed < limit:
                self._passed[key] = passed + 1
                return True
            self._waiting.setdefault(key, Lane()).push(run)
            return False

    def release(self, run: Run) -> Run | None:
        """``run`` (past the gate) is done: the next run of its key, which takes its
        place, or ``None``."""
        if run.definition.max_per_key is None or (key := self._key(run)) is None:
            return None
        with self._lock:
            waiting = self._waiting.get(key)
            following = None if waiting is None else waiting.pop()
            if following is not None:
                if not waiting:
                    del self._waiting[key]
                return following
            passed = self._passed.get(key, 0) - 1
            if passed > 0:
                self._passed[key] = passed
            else:
                self._passed.pop(key, None)
            return None


class _DelayHeap:
    """Runs waiting for their time, and the timer thread that hands each to ``release``
    once due (started with the first; a node that never delays has none). A run due
    while a pause is asked of it is held by its token until resumed, then released."""

    def __init__(self, clock: Clock, release: Callable[[Run], None]) -> None:
        self._clock = clock
        self._release = release
        self._cond = threading.Condition(threading.Lock())
        self.heap: list[tuple[float, int, Run]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def push(self, run: Run, delay: float) -> None:
        with self._cond:
            heapq.heappush(self.heap, (self._clock.monotonic() + delay, next(self._seq), run))
            if self.heap[0][2] is run:
                self._cond.notify()  # the earliest now: the timer sleeps less
            if self._thread is None and not self._closed:
                target = keep_running("timer", self._watch, stopping=lambda: self._closed)
                self._thread = threading.Thread(target=target, name="chongming-timer", daemon=True)
                self._thread.start()

    def pop_due(self) -> list[Run]:
        if not self.heap:
            return []
        now = self._clock.monotonic()
        due: list[Run] = []
        with self._cond:
            while self.heap and self.heap[0][0] <= now:
                due.append(heapq.heappop(self.heap)[2])
        return due

    def release_due(self) -> int:
        due = self.pop_due()
        release = self._release
        for run in due:
            if not run.signals.hold_while_paused(functools.partial(release, run)):
                release(run)
        return len(due)

    def _watch(self) -> None:
        """Sleep until the earliest run is due (woken sooner by an earlier one, or by
        ``close``), release what is due, and again."""
        heap, cond, clock = self.heap, self._cond, self._clock
        while True:
            with cond:
                while not self._closed and (not heap or heap[0][0] > clock.monotonic()):
                    cond.wait(heap[0][0] - clock.monotonic() if heap else None)
                if self._closed:
                    return
            self.release_due()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()


class FifoDispatcher:
    """First come, first served. ``put`` wakes one parked worker, the one that parked
    last, and nobody else.

    Why not ``queue.SimpleQueue``: its waiters all block on one lock, and a ``get`` that
    takes an item releases that lock again if a waiter had it, which wakes the next
    waiter to find the queue empty and block again. With four idle workers each run
    cost its workers 3.2 context switches where one is needed. Here each parked worker
    waits on a lock of its own, and the last to park is woken first: its stack and
    caches are warm, and the others sleep on.

    No lock of its own: the deque and the list change by single operations, each atomic
    under the interpreter's lock, and a worker looks at the runs again after it parks,
    so a run put meanwhile is never left waiting (``get``). A mutex around them cost the
    in-memory row 3k instructions a task (4 % of its rate)."""

    def __init__(self, clock: Clock) -> None:
        self._lane = Lane()
        self._runs = self._lane.plain  # priority 0: lock-free, as above
        self._ranked_lock = threading.Lock()  # the other priorities' heap
        self._parked: list[threading.Lock] = []  # each held; put() releases the last
        self._closed = False
        self._own = threading.local()  # each worker's parking lock
        self._delayed = _DelayHeap(clock, self.put)
        self._gate = KeyGate()
        self.direct: Callable[[Run], None] | None = None
        """Where a run carried off the worker threads (an async run, a process run)
        goes straight, skipping a worker's hand-over (this dispatcher keeps no count a
        worker would have to release): one wake-up a run, its carrier's, not a
        worker's and then its carrier's."""

    @property
    def parked(self) -> int:
        """Workers parked, waiting for a run."""
        return len(self._parked)

    def put(self, run: Run) -> None:
        if run.definition.max_per_key is not None and not self._gate.admit(run):
            return  # waits at the gate for one of its key to be done
        self._pass(run)

    def _pass(self, run: Run) -> None:
        direct = self.direct
        if direct is not None and run.definition.off_workers:
            direct(run)
            return
        if run.priority:
            with self._ranked_lock:
                self._lane.push(run)
        else:
            self._runs.append(run)
        self._wake_one()

    def _wake_one(self) -> None:
        if self._parked:
            try:
                parked = self._parked.pop()
            except IndexError:  # woken or gone meanwhile: each looks at the runs again
                return
            parked.release()

    def schedule(self, run: Run, delay: float) -> None:
        if delay <= 0:
            self.put(run)
            return
        self._delayed.push(run, delay)

    def get(self) -> Run | None:
        runs, parked = self._runs, self._parked
        park: threading.Lock | None = getattr(self._own, "park", None)
        if park is None:
            park = self._own.park = threading.Lock()
            park.acquire()  # held while its worker is not parked
        ranked = self._lane.ranked
        while True:
            if ranked:
                with self._ranked_lock:
                    run = self._lane.pop()
                if run is not None:
                    return run
            if runs:
                try:
                    return runs.popleft()
                except IndexError:  # another worker took it
                    continue
            if self._closed:
                return None
            parked.append(park)
            # A run put (or close()) between the look above and the append found nobody
            # to wake: look again, and unpark to take it.
            if runs or ranked or self._closed:
                self._unpark(park)
            else:
                park.acquire()  # until put() (or close()) releases it

    def _unpark(self, park: threading.Lock) -> None:
        """Off the list, or, if a ``put`` took ``park`` off meanwhile, hold the lock that
        ``put`` releases."""
        try:
            self._parked.remove(park)
        except ValueError:
            park.acquire()  # released by the put that took it off the list (or close())

    def get_nowait(self) -> Run | None:
        if self._delayed.heap:
            self._delayed.release_due()
        if self._lane.ranked:
            with self._ranked_lock:
                return self._lane.pop()
        try:
            return self._runs.popleft()
        except IndexError:
            return None

    def backlog(self) -> bool:
        return bool(self._lane)

    def done(self, run: Run) -> None:
        following = self._gate.release(run)
        if following is not None:
            self._pass(following)

    def release_due(self) -> int:
        return self._delayed.release_due()

    def close(self) -> None:
        """Every worker gets what is queued, then ``None``."""
        self._closed = True
        self._delayed.close()
        while self._parked:
            self._wake_one()


class FairDispatcher:
    def __init__(self, clock: Clock, *, max_parallel_per_bucket: int) -> None:
        self._limit = max_parallel_per_bucket
        self._cond = threading.Condition(threading.RLock())
        self._queues: dict[int | None, Lane] = {}
        self._rotation: deque[int | None] = deque()  # buckets with queued runs
        self._running: dict[int | None, int] = {}
        self._delayed = _DelayHeap(clock, self.put)
        self._gate = KeyGate()
        self._closed = False

    def put(self, run: Run) -> None:
        if run.definition.max_per_key is not None and not self._gate.admit(run):
            return  # waits at the gate for one of its key to be done
        with self._cond:
            self._enqueue(run)
            self._cond.notify()

    def schedule(self, run: Run, delay: float) -> None:
        if delay <= 0:
            self.put(run)
            return
        self._delayed.push(run, delay)

    def get(self) -> Run | None:
        with self._cond:
            while True:
                if self._closed:
                    return None
                run = self._pick()
                if run is not None:
                    return run
                self._cond.wait()

    def get_nowait(self) -> Run | None:
        with self._cond:
            if self._closed:
                return None
            self._delayed.release_due()
            return self._pick()

    def backlog(self) -> bool:
        return bool(self._rotation)  # a bucket at its limit counts: its runs wait too

    def done(self, run: Run) -> None:
        following = self._gate.release(run)
        with self._cond:
            self._running[run.bucket] -= 1
            if following is not None:
                self._enqueue(following)
            if self._queues.get(run.bucket) or following is not None:
                self._cond.notify()

    def release_due(self) -> int:
        return self._delayed.release_due()

    def close(self) -> None:
        self._delayed.close()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- internals (caller holds the condition) -------------------------------------------------

    def _enqueue(self, run: Run) -> None:
        bucket = run.bucket
        runs = self._queues.get(bucket)
        if runs is None:
            runs = self._queues[bucket] = Lane()
        if not runs:
            self._rotation.append(bucket)
        runs.push(run)

    def _pick(self) -> Run | None:
        """The highest priority at the head of a bucket below its limit; among equal
        heads, the next bucket in the rotation."""
        rotation, best, best_at = self._rotation, None, 0
        for at, bucket in enumerate(rotation):
            if self._running.get(bucket, 0) >= self._limit:
                continue
            head = self._queues[bucket].head()
            if head is not None and (best is None or head > best):
                best, best_at = head, at
        if best is None:
            return None
        rotation.rotate(-best_at)
        bucket = rotation.popleft()
        runs = self._queues[bucket]
        run = runs.pop()
        assert run is not None
        if runs:
            rotation.append(bucket)  # its next run waits for the others' turn
        self._running[bucket] = self._running.get(bucket, 0) + 1
        return run


def make_dispatcher(clock: Clock, *, max_parallel_per_bucket: int | None) -> Dispatcher:
    if max_parallel_per_bucket is None:
        return FifoDispatcher(clock)
    return FairDispatcher(clock, max_parallel_per_bucket=max_parallel_per_bucket)
