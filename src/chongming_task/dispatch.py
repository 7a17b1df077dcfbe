"""The ready queue between ``submit`` and the worker threads.

One FIFO per bucket, served round-robin, so one tenant's backlog in one bucket cannot
starve another bucket; ``max_parallel_per_bucket`` caps how many of a bucket's tasks run
at once. Retries wait in a delay heap until their backoff has passed (read from the
injectable clock, re-checked at least every ``tick`` seconds so a fake clock is noticed).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from typing import TYPE_CHECKING

from .clock import Clock

if TYPE_CHECKING:
    from .run import TaskRun


class Dispatcher:
    def __init__(
        self, clock: Clock, *, max_parallel_per_bucket: int | None, tick: float = 0.05
    ) -> None:
        self._clock = clock
        self._limit = max_parallel_per_bucket
        self._tick = tick
        self._cond = threading.Condition(threading.Lock())
        self._queues: dict[int | None, deque[TaskRun]] = {}
        self._rotation: deque[int | None] = deque()  # buckets with queued runs
        self._running: dict[int | None, int] = {}
        self._delayed: list[tuple[float, int, TaskRun]] = []
        self._seq = itertools.count()
        self._closed = False

    def put(self, run: TaskRun) -> None:
        with self._cond:
            self._enqueue(run)
            self._cond.notify()

    def schedule(self, run: TaskRun, delay: float) -> None:
        """Make ``run`` ready after ``delay`` seconds (a retry's backoff)."""
        if delay <= 0:
            self.put(run)
            return
        with self._cond:
            due = self._clock.monotonic() + delay
            heapq.heappush(self._delayed, (due, next(self._seq), run))
            self._cond.notify()

    def get(self) -> TaskRun | None:
        """Block until a run may start; ``None`` once closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                self._release_due()
                run = self._pick()
                if run is not None:
                    return run
                self._cond.wait(self._tick if self._delayed else None)

    def done(self, run: TaskRun) -> None:
        """The carrier finished with ``run`` (whatever its outcome)."""
        with self._cond:
            bucket = run.bucket
            self._running[bucket] -= 1
            if self._limit is not None and self._queues.get(bucket):
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def queued(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values()) + len(self._delayed)

    # -- internals (caller holds the condition) -------------------------------------------------

    def _enqueue(self, run: TaskRun) -> None:
        bucket = run.bucket
        queue = self._queues.get(bucket)
        if queue is None:
            queue = self._queues[bucket] = deque()
        if not queue:
            self._rotation.append(bucket)
        queue.append(run)

    def _release_due(self) -> None:
        if not self._delayed:
            return
        now = self._clock.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, run = heapq.heappop(self._delayed)
            self._enqueue(run)
            self._cond.notify()

    def _pick(self) -> TaskRun | None:
        for _ in range(len(self._rotation)):
            bucket = self._rotation[0]
            self._rotation.rotate(-1)
            if self._limit is not None and self._running.get(bucket, 0) >= self._limit:
                continue
            queue = self._queues[bucket]
            run = queue.popleft()
            if not queue:
                self._rotation.pop()  # the bucket just rotated to the end
            self._running[bucket] = self._running.get(bucket, 0) + 1
            return run
        return None
