"""Write-through of one task's transitions to the store, surviving failed writes.

The version expected by ``save`` is the version *last actually written*, never "this
version minus one": that formula assumed every earlier write had landed, so one failed
write froze the task in the store for good (distributed design §14.1). Transitions whose
write failed wait in a bounded buffer and land with the next transition, from the
supervisor loop, or at ``close()``; the store then jumps several versions at once. A
conflict against the version actually written means another writer changed the task:
write-through stops for that task and the controller lists it in ``desynced_tasks``.

Each write goes through the store's ``Capabilities.write_transitions``: one transaction
where the store offers one (the built-in SQL stores do), else ``save`` then ``append``.
Order: the compare-and-set first, then the trail: only the writer whose CAS succeeded
records the version in the audit trail, so a losing writer never leaves a transition
behind.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from .errors import ConcurrencyConflict, StoreUnavailable
from .model import TaskSnapshot, Transition
from .stores.capabilities import Capabilities, PartialWrite

__all__ = ["WriteThrough", "WriteThroughHost", "persist_together"]

log = logging.getLogger("chongming_task.writethrough")


class WriteThroughHost(Protocol):
    """The controller, as a write-through sees it: its store's capabilities (resolved
    once, with fallbacks) and where to report trouble."""

    capabilities: Capabilities

    def desynced(self, task_id: str, exc: ConcurrencyConflict) -> None: ...

    def behind(self, task_id: str) -> None: ...


class WriteThrough:
    """Persists one task. Not thread-safe: the owning ``TaskRun`` calls it under its lock."""

    # A node holds one per run: no per-instance bound methods or containers until a write
    # fails (every tracked object is one more for each full garbage collection to walk).
    __slots__ = (
        "_buffer",
        "_host",
        "_limit",
        "desynced",
        "dropped",
        "last_error",
        "task_id",
        "written_version",
    )

    def __init__(
        self,
        host: WriteThroughHost,
        task_id: str,
        *,
        written_version: int,
        buffer_limit: int,
    ) -> None:
        self._host = host
        self.task_id = task_id
        self.written_version = written_version
        self._limit = buffer_limit
        self._buffer: deque[Transition] | None = None  # made on the first failed write
        self.desynced = False
        self.dropped = 0
        self.last_error: BaseException | None = None  # of the latest failed write

    def shares(self, snapshot: TaskSnapshot) -> bool:
        """Whether the write of ``snapshot`` may share a store call with other tasks'
        (``persist_together``): nothing buffered, not desynced, a version to write."""
        return not (
            self.desynced or self._buffer or snapshot.status_version == self.written_version
        )

    @property
    def pending(self) -> int:
        """Transitions not yet in the store."""
        return len(self._buffer) if self._buffer else 0

    def _buffered(self) -> deque[Transition]:
        if self._buffer is None:
            self._buffer = deque(maxlen=self._limit)
        return self._buffer

    def behind(self, snapshot: TaskSnapshot) -> bool:
        return not self.desynced and (
            bool(self._buffer) or snapshot.status_version != self.written_version
        )

    def persist(self, snapshot: TaskSnapshot, pending: tuple[Transition, ...]) -> bool:
        """Write ``snapshot`` and the transitions that led to it (``pending``, in order;
        after anything still buffered).

        Returns whether the store is now up to date. Never raises for store failures.
        """
        if self.desynced:
            return False
        if not self._buffer:  # the common case: write it at once, no buffering
            if snapshot.status_version == self.written_version:
                return self.flush(snapshot, pending) or self._keep(pending)
            try:  # flush() inline: two calls less on every transition's way to the store
                self._host.capabilities.compare_and_write(
                    snapshot, expect_version=self.written_version, transitions=pending
                )
            except Exception as exc:
                caught = self._settle(snapshot, exc, len(pending), not pending)
                return caught or self._keep(pending)
            self.written_version = snapshot.status_version
            self.last_error = None
            return True
        if len(self._buffer) == self._limit:
            self.dropped += 1
            log.error(
                "task %s: write-through buffer full; the oldest unwritten transition is "
                "dropped from the audit trail (the snapshot will still catch up)",
                self.task_id,
            )
        self._buffered().extend(pending)
        return self.flush(snapshot)

    def _keep(self, pending: tuple[Transition, ...]) -> bool:
        """After a failed write of ``pending`` (nothing buffered before it): keep them
        for the catch-up, unless the task is desynced. Returns ``False``."""
        if not self.desynced:
            self._buffered().extend(pending)
            self._host.behind(self.task_id)
        return False

    def flush(self, snapshot: TaskSnapshot, pending: Sequence[Transition] = ()) -> bool:
        """Bring the store up to ``snapshot``: the buffer, then ``pending`` (transitions
        the caller has not buffered; none when catching up). Returns whether it is now up
        to date."""
        if self.desynced:
            return False
        catching_up = not pending
        if self._buffer:
            pending = [*self._buffer, *pending]
        host = self._host
        try:
            # One transaction where the store can (rows encoded before its lock is
            # taken).
            if snapshot.status_version != self.written_version:
                host.capabilities.compare_and_write(
                    snapshot, expect_version=self.written_version, transitions=pending
                )
            else:  # the row is current, only the trail is behind
                host.capabilities.write_transitions(
                    snapshot, expect_version=None, transitions=pending
                )
        except Exception as exc:
            return self._settle(snapshot, exc, len(pending), catching_up)
        return self._settle(snapshot, None, len(pending), catching_up)

    def _settle(
        self, snapshot: TaskSnapshot, exc: BaseException | None, pending: int, catching_up: bool
    ) -> bool:
        """Take in how the write of ``snapshot`` (and ``pending`` transitions) went;
        returns whether the store is now up to date."""
        if exc is None:
            self.written_version = snapshot.status_version
            if self._buffer:
                self._buffer.clear()
            self.last_error = None
            return True
        if isinstance(exc, PartialWrite):
            # The save landed, an append did not: the stored version moved. The trail
            # stays buffered (appends are idempotent, so rewriting them is harmless).
            self.written_version = snapshot.status_version
        elif isinstance(exc, ConcurrencyConflict):
            self.desynced = True
            self._buffer = None
            self._host.desynced(self.task_id, exc)
            return False
        return self._failed(exc, pending, catching_up)

    def _failed(self, exc: BaseException, pending: int, catching_up: bool) -> bool:
        self.last_error = exc
        # An outage is reported once, by the supervisor; other failures per task.
        log.log(
            logging.DEBUG if isinstance(exc, StoreUnavailable) else logging.WARNING,
            "task %s: write-through failed (%s: %s); %d transition(s) buffered, will catch up",
            self.task_id,
            type(exc).__name__,
            exc,
            pending,
        )
        if catching_up:
            self._host.behind(self.task_id)
        return False


def persist_together(
    writes: Sequence[tuple[WriteThrough, TaskSnapshot, tuple[Transition, ...]]],
) -> None:
    """``persist`` for several tasks' write-throughs (one controller's) at once: those
    with nothing buffered share one store call (``compare_and_write_together``: one
    statement on a store with group commit), the others persist alone. Each write stands
    alone: one's conflict or failure costs the others nothing."""
    together: list[tuple[WriteThrough, TaskSnapshot, tuple[Transition, ...]]] = []
    alone: list[tuple[WriteThrough, TaskSnapshot, tuple[Transition, ...]]] = []
    for write in writes:
        (together if write[0].shares(write[1]) else alone).append(write)
    if len(together) == 1:
        alone += together
    elif together:
        capabilities = together[0][0]._host.capabilities
        try:
            errors = capabilities.compare_and_write_together(
                [(snapshot, wt.written_version, pending) for wt, snapshot, pending in together]
            )
        except Exception:  # the call failed as a whole (one write's value, say): one by one,
            alone += together  # so each write gets its own outcome
        else:
            for (wt, snapshot, pending), exc in zip(together, errors, strict=True):
                if not wt._settle(snapshot, exc, len(pending), False):
                    wt._keep(pending)
    for wt, snapshot, pending in alone:
        wt.persist(snapshot, pending)
