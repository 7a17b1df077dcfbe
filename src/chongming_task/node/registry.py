"""``RunRegistry``: the runs one node holds, and which of them are on a carrier, behind in
the store, or desynced. Shared by the controller and its services (supervisor, command
poller, workers); it runs no thread and does no store I/O.

A run is *held* from the moment it is prepared until it is terminal **and** fully
written: a run whose terminal transition is still buffered stays held, so the supervisor
keeps catching it up and renewing nothing for it.

A run waiting for its time (a delayed task) holds a lease that runs past its time, so
the lease renewal need not look at it before then: it is *leased* (``leased``, what the
renewal walks) only from the moment its lease comes due, kept apart until then in a heap
by that moment. 100,000 waiting tasks cost the renewal nothing while they wait.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..model import TaskSnapshot
    from ..run.life import Run

__all__ = ["MAX_DOUBTFUL", "RunRegistry"]

MAX_DOUBTFUL = 10_000
"""Doubtful creates a node keeps to resolve (a submit loop through a long outage makes
one a failed call)."""


class RunRegistry:
    """Held, active, behind and desynced runs of one node."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # RLock: its Condition checks ownership in C
        self._idle = threading.Condition(self._lock)
        self._idle_waiters = 0
        # Single dict operations are atomic on their own: the hot paths (submit, a worker
        # taking a run) take no lock another thread holds across a GIL switch.
        self._held: dict[str, Run] = {}
        self._leased: dict[str, Run] = {}  # held, the renewal's to look at
        self._waiting: list[tuple[float, int, Run]] = []  # held, leased from then on
        self._order = itertools.count()
        self._active: dict[str, Run] = {}
        self._behind: set[str] = set()
        self._desynced: set[str] = set()
        self._late: list[TaskSnapshot] = []
        self._doubtful: dict[str, TaskSnapshot] = {}  # created, commit outcome unknown
        self._resolved: dict[str, None] = {}  # doubtful creates judged since, oldest first

    # -- held ---------------------------------------------------------------------------------

    def add(self, run: Run, *, leased_from: float | None = None) -> None:
        """Hold ``run``; ``leased_from``: the monotonic time its lease comes due, for a
        run waiting for its time (the renewal looks at it from then on)."""
        self._held[run.task_id] = run
        if leased_from is None:
            self._leased[run.task_id] = run
            return
        with self._lock:
            heapq.heappush(self._waiting, (leased_from, next(self._order), run))

    def leased(self, now: float) -> list[Run]:
        """The held runs whose lease the renewal looks after at monotonic ``now``."""
        waiting = self._waiting
        if waiting and waiting[0][0] <= now:
            with self._lock:
                while waiting and waiting[0][0] <= now:
                    run = heapq.heappop(waiting)[2]
                    if run.task_id in self._held:
                        self._leased[run.task_id] = run
        return list(self._leased.values())

    def get(self, task_id: str) -> Run | None:
        return self._held.get(task_id)

    def held(self) -> list[Run]:
        return list(self._held.values())

    def held_ids(self) -> set[str]:
        """The held runs' ids, and the doubtful creates' (nobody else's to judge)."""
        with self._lock:
            return set(self._held) | set(self._doubtful)

    # -- creates whose commit outcome is unknown ----------------------------------------------

    def doubt(self, snapshots: Iterable[TaskSnapshot]) -> int:
        """Keep the snapshots of creates that failed with the store unreachable: their
        commit may have landed though the caller was told it failed (docs/design.md,
        "A commit nobody heard"). At most ``MAX_DOUBTFUL``; returns how many were left
        out (their tasks, if stored, are judged by a reconcile once their lease ends)."""
        left_out = 0
        with self._lock:
            for snapshot in snapshots:
                if len(self._doubtful) >= MAX_DOUBTFUL:
                    left_out += 1
                else:
                    self._doubtful[snapshot.task_id] = snapshot
        return left_out

    def doubtful(self) -> list[TaskSnapshot]:
        if not self._doubtful:  # the common case, every supervisor pass: no lock
            return []
        with self._lock:
            return list(self._doubtful.values())

    def doubted(self, task_id: str) -> TaskSnapshot | None:
        """The doubtful create of ``task_id``, if it is one."""
        return self._doubtful.get(task_id)

    def resolved(self, task_id: str) -> None:
        """The doubtful create of ``task_id`` was judged (and ended, if it was stored)."""
        with self._lock:
            if self._doubtful.pop(task_id, None) is not None:
                self._resolved[task_id] = None
                while len(self._resolved) > MAX_DOUBTFUL:
                    del self._resolved[next(iter(self._resolved))]

    def was_doubtful(self, task_id: str) -> bool:
        """Whether ``task_id`` was a doubtful create, judged since (one of the latest
        ``MAX_DOUBTFUL``): a submit that found it holding a key may look again."""
        return task_id in self._resolved

    def forget(self, runs: Iterable[Run]) -> None:
        """Drop runs that were never stored."""
        with self._lock:
            for run in runs:
                self._held.pop(run.task_id, None)
                self._leased.pop(run.task_id, None)

    def ended(self, run: Run, *, written: bool) -> None:
        """``run`` is terminal: no longer held once ``written``. Wakes ``wait_all_done``."""
        if written:
            self._held.pop(run.task_id, None)
            self._leased.pop(run.task_id, None)
        # Read after the pop: a waiter counted itself under the lock before checking, so
        # either it sees the pop or we see it and wake it.
        if self._idle_waiters:
            with self._idle:
                self._idle.notify_all()

    def wait_all_done(self, timeout: float | None) -> bool:
        """Wait until every held run is terminal; return whether they are."""
        with self._idle:
            self._idle_waiters += 1
            try:
                return self._idle.wait_for(
                    lambda: all(r.done() for r in list(self._held.values())), timeout
                )
            finally:
                self._idle_waiters -= 1

    # -- on a carrier -------------------------------------------------------------------------

    def started(self, run: Run) -> None:
        self._active[run.task_id] = run

    def finished(self, run: Run) -> None:
        self._active.pop(run.task_id, None)

    def active(self) -> list[Run]:
        return list(self._active.values())

    # -- store state --------------------------------------------------------------------------

    def mark_behind(self, task_id: str) -> None:
        with self._lock:
            self._behind.add(task_id)

    def take_behind(self) -> list[Run]:
        """The held runs marked behind since the last call (the marks are cleared)."""
        with self._lock:
            found = (self._held.get(t) for t in self._behind)
            behind = [run for run in found if run is not None]
            self._behind.clear()
        return behind

    def mark_desynced(self, task_id: str) -> None:
        with self._lock:
            self._desynced.add(task_id)
            self._behind.discard(task_id)

    def desynced(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._desynced)

    def report_late(self, ended: TaskSnapshot) -> None:
        """A desynced run ended here (``ended``: how): its late report is to be kept
        beside the task (the supervisor writes it, again after a failure)."""
        with self._lock:
            self._late.append(ended)

    def take_late(self) -> list[TaskSnapshot]:
        with self._lock:
            taken, self._late = self._late, []
            return taken
