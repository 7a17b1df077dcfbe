"""``CancellationToken``: how a running task hears stop and pause, and reports progress.

The task calls ``checkpoint()`` regularly. A checkpoint records the heartbeat and
progress, raises ``StopRequested`` when a stop, cancel or timeout was asked for, and blocks
while the task is paused, acknowledging the pause first. Requests come from any thread.

Acknowledgement is driven by a pause generation, not a one-shot flag: a pause requested
again right after a resume, while the task thread is still inside the wait loop, is
acknowledged too (the old ``_ack`` defect left the second pause unacknowledged forever).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal

from ..clock import Clock
from ..errors import StopRequested
from ..model import Progress
from ..values import STRICT, ValueRules, check_progress

__all__ = ["CancellationToken", "StopKind"]

_NO_UPSTREAM: Mapping[str, Any] = MappingProxyType({})

StopKind = Literal["stop", "cancel", "timeout"]


def _no_ack() -> None:
    pass


class CancellationToken:
    """Cooperative control for one task; passed as the task function's first argument."""

    __slots__ = (
        "_acked_generation",
        "_activity",
        "_clock",
        "_cond_or_none",
        "_heartbeat",
        "_lock",
        "_on_pause_ack",
        "_pause_generation",
        "_pause_requested",
        "_progress",
        "_rules",
        "_stop_kind",
        "_stop_reason",
        "attempt",
        "task_id",
        "upstream",
    )

    def __init__(
        self,
        task_id: str,
        clock: Clock,
        *,
        on_pause_ack: Callable[[], None] = lambda: None,
        lock: threading.RLock | None = None,
        rules: ValueRules = STRICT,
    ) -> None:
        self.task_id = task_id
        self._rules = rules  # what the store can hold: progress is checked against it
        self.attempt = 0
        # Pipeline nodes: each dependency's result (the runtime sets a new dict; the shared
        # empty default costs nothing per task).
        self.upstream: Mapping[str, Any] = _NO_UPSTREAM
        self._clock = clock
        self._on_pause_ack = on_pause_ack
        # Re-entrant (a regression test holds it across resume() + request_pause()); the
        # runtime passes the run's own lock, so token and run never order two locks.
        self._lock = lock if lock is not None else threading.RLock()
        self._cond_or_none: threading.Condition | None = None
        self._stop_kind: StopKind | None = None
        self._stop_reason: str | None = None
        self._pause_requested = False
        self._pause_generation = 0
        self._acked_generation = 0
        self._progress: Progress | None = None
        self._heartbeat: datetime | None = None
        self._activity = 0  # bumped on every checkpoint; the flusher compares it

    @property
    def _cond(self) -> threading.Condition:
        """The condition over ``_lock``, made on first use: most tasks never wait on it."""
        with self._lock:
            if self._cond_or_none is None:
                self._cond_or_none = threading.Condition(self._lock)
            return self._cond_or_none

    def _notify(self) -> None:
        """Wake waiters, if any. Caller holds ``_lock``; a waiter made the condition under
        the same lock before waiting, so no wake-up is lost."""
        if self._cond_or_none is not None:
            self._cond_or_none.notify_all()

    # -- what the task calls ---------------------------------------------------------------------

    def checkpoint(self, progress: Progress | float | None = None) -> None:
        """Record a heartbeat (and progress), then obey any stop or pause request.

        ``progress`` is a ``Progress`` or a plain number (``current``, total unknown).
        Raises ``StopRequested`` when asked to stop; let it propagate. Raises
        ``InvalidValue`` (a ``ValueError``), recording nothing, for progress the store could
        not hold (NaN, infinity, a ``Decimal``, a message that is not UTF-8 text): it is
        this task's fault, reported in this task's thread, and never reaches the
        supervisor that renews every task's lease.
        """
        if progress is not None:
            progress = check_progress(progress, self._rules)
        now = self._clock.now()
        with self._lock:
            self._heartbeat = now
            if progress is not None:
                self._progress = progress
            self._activity += 1
            if self._stop_kind is not None:
                raise StopRequested(self._stop_reason or f"task {self.task_id}: stop requested")
            if not self._pause_requested:
                return
        self._wait_while_paused()

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds`` of real time, waking at once to raise on a stop request.

        Ends with a ``checkpoint()``, so a pause requested meanwhile is honoured too.
        """
        with self._cond:
            self._cond.wait_for(lambda: self._stop_kind is not None, timeout=seconds)
        self.checkpoint()

    @property
    def checkpointed(self) -> bool:
        """Whether the task has reached a checkpoint at least once."""
        return self._activity != 0

    @property
    def stop_requested(self) -> bool:
        return self._stop_kind is not None

    @property
    def pause_requested(self) -> bool:
        return self._pause_requested

    @property
    def stop_kind(self) -> StopKind | None:
        return self._stop_kind

    @property
    def progress(self) -> Progress | None:
        return self._progress

    @property
    def heartbeat_at(self) -> datetime | None:
        return self._heartbeat

    # -- what the runtime calls (any thread) -------------------------------------------------------

    def request_stop(self, kind: StopKind = "stop", reason: str | None = None) -> None:
        with self._lock:
            if self._stop_kind is None:
                self._stop_kind = kind
                self._stop_reason = reason
            self._notify()

    def request_pause(self) -> None:
        with self._lock:
            self._pause_requested = True
            self._pause_generation += 1
            self._notify()

    def resume(self) -> None:
        with self._lock:
            self._pause_requested = False
            self._notify()

    def detach(self) -> None:
        """The runtime's: the task ended; no pause will be acknowledged any more. Drops the
        callback into the run (the one reference cycle, run -> token -> run)."""
        self._on_pause_ack = _no_ack

    def activity(self) -> tuple[int, Progress | None, datetime | None]:
        with self._lock:
            return self._activity, self._progress, self._heartbeat

    # -- internals -------------------------------------------------------------------------------

    def _wait_while_paused(self) -> None:
        while True:
            with self._lock:
                if self._stop_kind is not None:
                    raise StopRequested(self._stop_reason or f"task {self.task_id}: stop requested")
                if not self._pause_requested:
                    return
                generation = self._pause_generation
            self._on_pause_ack()  # pausing -> paused, outside our lock (it takes the run's)
            with self._cond:
                self._acked_generation = generation
                self._cond.wait_for(
                    lambda: (
                        self._stop_kind is not None
                        or not self._pause_requested
                        or self._pause_generation != self._acked_generation
                    )
                )
