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
from typing import TYPE_CHECKING, Protocol

from ..errors import ConcurrencyConflict, StoreUnavailable
from ..model import TaskSnapshot, Transition
from ..stores.capabilities import Capabilities, PartialWrite

__all__ = ["WriteThrough", "WriteThroughHost", "persist_together"]

log = logging.getLogger("chongming_task.writethrough")


class WriteThroughHost(Protocol):
    """The controller, as a write-through sees it: its store's capabilities (resolved
    once, with fallbacks), the buffer's bound, and where to report trouble."""

    capabilities: Capabilities
    writethrough_buffer: int

    def desynced(self, task_id: str, exc: ConcurrencyConflict) -> None: ...

    def behind(self, task_id: str) -> None: ...


class WriteThrough:
    """Persists one task: a mixin of ``TaskRun``, which holds its state in slots of its
    own (``_wt_*``, with ``task_id`` and ``_host``). Not thread-safe: the run calls it
    holding its write lock.

    A mixin, not an object a run holds: a node holds every run its callers hold, and
    each object it keeps is one more for every garbage collection to walk (a held no-op
    run: 6 tracked objects became 5; docs/benchmarks.md, twenty-second session)."""

    if TYPE_CHECKING:  # TaskRun holds the state; mypy checks the names against these
        __slots__ = ("_wt_buffer", "_wt_desynced", "_wt_dropped", "_wt_error", "_wt_written")

        @property
        def _host(self) -> WriteThroughHost: ...

        @property
        def task_id(self) -> str: ...

    else:
        __slots__ = ()

    _wt_written: int
    """The version last actually written (``save`` expects it)."""
    _wt_buffer: deque[Transition] | None
    """Transitions whose write failed; made on the first failed write."""
    _wt_desynced: bool
    _wt_dropped: int
    """Transitions dropped from a full buffer."""
    _wt_error: BaseException | None
    """Why the latest write failed (``None`` once one succeeds)."""

    def _wt_shares(self, snapshot: TaskSnapshot) -> bool:
        """Whether the write of ``snapshot`` may share a store call with other tasks'
        (``persist_together``): nothing buffered, not desynced, a version to write."""
        return not (
            self._wt_desynced or self._wt_buffer or snapshot.status_version == self._wt_written
        )

    def _wt_buffered(self) -> deque[Transition]:
        if self._wt_buffer is None:
            self._wt_buffer = deque(maxlen=self._host.writethrough_buffer)
        return self._wt_buffer

    def _wt_behind(self, snapshot: TaskSnapshot) -> bool:
        return not self._wt_desynced and (
            bool(self._wt_buffer) or snapshot.status_version != self._wt_written
        )

    def _wt_persist(self, snapshot: TaskSnapshot, pending: tuple[Transition, ...]) -> bool:
        """Write ``snapshot`` and the transitions that led to it (``pending``, in order;
        after anything still buffered).

        Returns whether the store is now up to date. Never raises for store failures.
        """
        if self._wt_desynced:
            return False
        buffer = self._wt_buffer
        if not buffer:  # the common case: write it at once, no buffering
            if snapshot.status_version == self._wt_written:
                return self._wt_flush(snapshot, pending) or self._wt_keep(pending)
            try:  # _wt_flush() inline: two calls less on every transition's way to the store
                self._host.capabilities.compare_and_write(
                    snapshot, expect_version=self._wt_written, transitions=pending
                )
            except Exception as exc:
                caught = self._wt_settle(snapshot, exc, len(pending), not pending)
                return caught or self._wt_keep(pending)
            self._wt_written = snapshot.status_version
            self._wt_error = None
            return True
        if len(buffer) == self._host.writethrough_buffer:
            self._wt_dropped += 1
            log.error(
                "task %s: write-through buffer full; the oldest unwritten transition is "
                "dropped from the audit trail (the snapshot will still catch up)",
                self.task_id,
            )
        buffer.extend(pending)
        return self._wt_flush(snapshot)

    def _wt_keep(self, pending: tuple[Transition, ...]) -> bool:
        """After a failed write of ``pending`` (nothing buffered before it): keep them
        for the catch-up, unless the task is desynced. Returns ``False``."""
        if not self._wt_desynced:
            self._wt_buffered().extend(pending)
            self._host.behind(self.task_id)
        return False

    def _wt_flush(self, snapshot: TaskSnapshot, pending: Sequence[Transition] = ()) -> bool:
        """Bring the store up to ``snapshot``: the buffer, then ``pending`` (transitions
        the caller has not buffered; none when catching up). Returns whether it is now up
        to date."""
        if self._wt_desynced:
            return False
        catching_up = not pending
        if self._wt_buffer:
            pending = [*self._wt_buffer, *pending]
        host = self._host
        try:
            # One transaction where the store can (rows encoded before its lock is
            # taken).
            if snapshot.status_version != self._wt_written:
                host.capabilities.compare_and_write(
                    snapshot, expect_version=self._wt_written, transitions=pending
                )
            else:  # the row is current, only the trail is behind
                host.capabilities.write_transitions(
                    snapshot, expect_version=None, transitions=pending
                )
        except Exception as exc:
            return self._wt_settle(snapshot, exc, len(pending), catching_up)
        return self._wt_settle(snapshot, None, len(pending), catching_up)

    def _wt_settle(
        self, snapshot: TaskSnapshot, exc: BaseException | None, pending: int, catching_up: bool
    ) -> bool:
        """Take in how the write of ``snapshot`` (and ``pending`` transitions) went;
        returns whether the store is now up to date."""
        if exc is None:
            self._wt_written = snapshot.status_version
            if self._wt_buffer:
                self._wt_buffer.clear()
            self._wt_error = None
            return True
        if isinstance(exc, PartialWrite):
            # The save landed, an append did not: the stored version moved. The trail
            # stays buffered (appends are idempotent, so rewriting them is harmless).
            self._wt_written = snapshot.status_version
        elif isinstance(exc, ConcurrencyConflict):
            self._wt_desynced = True
            self._wt_buffer = None
            self._host.desynced(self.task_id, exc)
            return False
        return self._wt_failed(exc, pending, catching_up)

    def _wt_failed(self, exc: BaseException, pending: int, catching_up: bool) -> bool:
        self._wt_error = exc
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
    """``_wt_persist`` for several tasks (one controller's) at once: those with nothing
    buffered share one store call (``compare_and_write_together``: one statement on a
    store with group commit), the others persist alone. Each write stands alone: one's
    conflict or failure costs the others nothing."""
    together: list[tuple[WriteThrough, TaskSnapshot, tuple[Transition, ...]]] = []
    alone: list[tuple[WriteThrough, TaskSnapshot, tuple[Transition, ...]]] = []
    for write in writes:
        (together if write[0]._wt_shares(write[1]) else alone).append(write)
    if len(together) == 1:
        alone += together
    elif together:
        capabilities = together[0][0]._host.capabilities
        try:
            errors = capabilities.compare_and_write_together(
                [(snapshot, wt._wt_written, pending) for wt, snapshot, pending in together]
            )
        except Exception:  # the call failed as a whole (one write's value, say): one by one,
            alone += together  # so each write gets its own outcome
        else:
            for (wt, snapshot, pending), exc in zip(together, errors, strict=True):
                if not wt._wt_settle(snapshot, exc, len(pending), False):
                    wt._wt_keep(pending)
    for wt, snapshot, pending in alone:
        wt._wt_persist(snapshot, pending)
