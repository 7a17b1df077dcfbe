"""``CancellationToken``: how a running task hears stop and pause, and reports progress;
``RunSignals``: the node's side of it, where the requests arrive.

The task calls ``checkpoint()`` regularly. A checkpoint records the heartbeat and
progress, raises ``StopRequested`` when a stop, cancel or timeout was asked for, and blocks
while the task is paused, acknowledging the pause first. Requests come from any thread.

Acknowledgement is driven by a pause generation, not a one-shot flag: a pause requested
again right after a resume, while the task thread is still inside the wait loop, is
acknowledged too (the old ``_ack`` defect left the second pause unacknowledged forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, Literal, Protocol

from ..clock import Clock
from ..errors import StopRequested
from ..model import Progress
from ..values import STRICT, ValueRules, check_progress

__all__ = ["CancellationToken", "RunSignals", "Signals", "StopKind", "task_of"]

_NO_UPSTREAM: Mapping[str, Any] = MappingProxyType({})

StopKind = Literal["stop", "cancel", "timeout"]


def _no_ack() -> None:
    pass


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class RunSignals:
    """The requests one run hears (stop, pause, resume) and the activity it reports
    (heartbeat, progress), shared by the node's run and the task's ``CancellationToken``:
    the task's calls are under "what the task calls", the node's under "what the runtime
    calls". Every request comes from any thread."""

    __slots__ = (
        "_acked_generation",
        "_activity",
        "_async",
        "_clock",
        "_cond_or_none",
        "_heartbeat",
        "_held",
        "_lock",
        "_on_pause_ack",
        "_pause_generation",
        "_pause_requested",
        "_progress",
        "_rules",
        "_stop_kind",
        "_stop_reason",
        "_waker",
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
        self._held: Callable[[], None] | None = None  # a due run waiting for resume()
        self._pause_generation = 0
        self._acked_generation = 0
        self._progress: Progress | None = None
        self._heartbeat: datetime | None = None
        self._activity = 0  # bumped on every checkpoint; the flusher compares it
        self._async = False  # an ``async def`` task's token: the awaited twins only
        self._waker: Callable[[], None] | None = None  # an awaiting twin's wake-up

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
        if self._waker is not None:
            self._waker()

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
        if self._async:
            raise TypeError(
                f"task {self.task_id} is async: `await token.acheckpoint()` (checkpoint() "
                "would block the event loop)"
            )
        if self._record(progress):
            self._wait_while_paused()

    def _record(self, progress: Progress | float | None) -> bool:
        """A checkpoint's record; raises on a stop; whether a pause is to be obeyed."""
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
            return self._pause_requested

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds`` of real time, waking at once to raise on a stop request.

        Ends with a ``checkpoint()``, so a pause requested meanwhile is honoured too.
        """
        if self._async:
            raise TypeError(
                f"task {self.task_id} is async: `await token.asleep(seconds)` (sleep() "
                "would block the event loop)"
            )
        with self._cond:
            self._cond.wait_for(lambda: self._stop_kind is not None, timeout=seconds)
        self.checkpoint()

    # -- what an ``async def`` task awaits (the node's event loop never blocks) --------------------

    async def acheckpoint(self, progress: Progress | float | None = None) -> None:
        """``checkpoint()`` for an ``async def`` task: records the heartbeat (and
        progress), raises ``StopRequested`` when asked to stop, and *awaits* while the
        task is paused. ``InvalidValue`` for progress the store could not hold."""
        if self._record(progress):
            await self._await_while_paused()

    async def asleep(self, seconds: float) -> None:
        """Sleep up to ``seconds`` without blocking the loop; a stop ends it at once
        (``StopRequested``), a pause holds it (awaited) and the rest is slept after the
        resume. Ends with an ``acheckpoint()``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (left := deadline - loop.time()) > 0:
            await self._changed(lambda: self._stop_kind is not None or self._pause_requested, left)
            if self._stop_kind is not None or self._pause_requested:
                await self.acheckpoint()
        await self.acheckpoint()

    async def _await_while_paused(self) -> None:
        while (generation := self._pause_to_ack()) is not None:
            self._on_pause_ack()  # pausing -> paused, outside our lock (it takes the run's)
            with self._lock:
                self._acked_generation = generation
            await self._changed(self._pause_over, None)

    async def _changed(self, done: Callable[[], bool], timeout: float | None) -> None:
        """Await until a request changes what ``done()`` says, or ``timeout``. One bare
        future and at most one timer: ten thousand sleeping tasks hold little."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(_resolve, woken)

        with self._lock:
            if done():
                return
            self._waker = wake
        timer = None if timeout is None else loop.call_later(timeout, _resolve, woken)
        try:
            await woken
        finally:
            if timer is not None:
                timer.cancel()
            with self._lock:
                self._waker = None

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
            held, self._held = self._held, None
            self._notify()
        if held is not None:
            held()

    def hold_while_paused(self, resumed: Callable[[], None]) -> bool:
        """The runtime's: a run due from the delay heap (a delayed task, a retry) while a
        pause is asked of it, before it started, is held: ``resume()`` then calls
        ``resumed``. Whether it is held."""
        with self._lock:
            if not self._pause_requested:
                return False
            self._held = resumed
            return True

    def make_async(self) -> None:
        """The runtime's: this is an ``async def`` task's token (only the awaited twins
        may be called: the blocking ones would stall the node's event loop)."""
        self._async = True

    def detach(self) -> None:
        """The runtime's: the task ended; no pause will be acknowledged any more. Drops the
        callback into the run (the one reference cycle, run -> token -> run)."""
        self._on_pause_ack = _no_ack

    def activity(self) -> tuple[int, Progress | None, datetime | None]:
        with self._lock:
            return self._activity, self._progress, self._heartbeat

    # -- internals -------------------------------------------------------------------------------

    def _wait_while_paused(self) -> None:
        while (generation := self._pause_to_ack()) is not None:
            self._on_pause_ack()  # pausing -> paused, outside our lock (it takes the run's)
            with self._cond:
                self._acked_generation = generation
                self._cond.wait_for(self._pause_over)

    def _pause_to_ack(self) -> int | None:
        """While paused: the pause generation to acknowledge; ``None`` once resumed.
        Raises ``StopRequested`` on a stop (paused or not)."""
        with self._lock:
            if self._stop_kind is not None:
                raise StopRequested(self._stop_reason or f"task {self.task_id}: stop requested")
            return self._pause_generation if self._pause_requested else None

    def _pause_over(self) -> bool:
        """Whether the pause being waited out has changed: a stop, a resume, or a pause
        asked again (a new generation to acknowledge)."""
        return (
            self._stop_kind is not None
            or not self._pause_requested
            or self._pause_generation != self._acked_generation
        )


class Signals(Protocol):
    """What a token speaks through: ``RunSignals`` in the node's process, a worker
    process's ``run.child.ChildSignals`` across the boundary."""

    task_id: str

    @property
    def upstream(self) -> Mapping[str, Any]: ...

    @property
    def stop_kind(self) -> str | None: ...

    @property
    def progress(self) -> Progress | None: ...

    def checkpoint(self, progress: Progress | float | None = None) -> None: ...

    def sleep(self, seconds: float) -> None: ...

    async def acheckpoint(self, progress: Progress | float | None = None) -> None: ...

    async def asleep(self, seconds: float) -> None: ...


class CancellationToken:
    """Cooperative control for one task, passed as its function's first argument: what
    task code calls, and nothing else. ``checkpoint()`` records a heartbeat (and
    progress), raises ``StopRequested`` once a stop is asked, and blocks while the task
    is paused; ``sleep()`` is a sleep a stop cuts short. An ``async def`` task awaits
    their twins, ``acheckpoint()`` and ``asleep()``. ``upstream`` holds a pipeline
    node's dependencies' results. Which task and attempt this is:
    ``chongming_task.current()``."""

    __slots__ = ("_signals",)

    def __init__(self, signals: Signals) -> None:
        self._signals = signals

    def __repr__(self) -> str:
        return f"<CancellationToken of task {self._signals.task_id}>"

    def checkpoint(self, progress: Progress | float | None = None) -> None:
        """Record a heartbeat (and progress), then obey any stop or pause request.

        ``progress`` is a ``Progress`` or a plain number (``current``, total unknown).
        Raises ``StopRequested`` when asked to stop; let it propagate. Raises
        ``InvalidValue`` (a ``ValueError``), recording nothing, for progress the store could
        not hold (NaN, infinity, a ``Decimal``, a message that is not UTF-8 text): it is
        this task's fault, reported in this task's thread, and never reaches the
        supervisor that renews every task's lease.
        """
        self._signals.checkpoint(progress)

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds`` of real time, waking at once to raise on a stop request.
        Ends with a ``checkpoint()``, so a pause requested meanwhile is honoured too."""
        self._signals.sleep(seconds)

    async def acheckpoint(self, progress: Progress | float | None = None) -> None:
        """``checkpoint()`` for an ``async def`` task: a pause is *awaited*, never
        blocking the node's event loop."""
        await self._signals.acheckpoint(progress)

    async def asleep(self, seconds: float) -> None:
        """``sleep()`` for an ``async def`` task: a stop ends it at once, a pause holds it
        (awaited) and the rest is slept after the resume."""
        await self._signals.asleep(seconds)

    @property
    def upstream(self) -> Mapping[str, Any]:
        """A pipeline node's dependencies' results, by their keys (empty elsewhere)."""
        return self._signals.upstream

    @property
    def stop_requested(self) -> bool:
        """Whether a stop (or cancel, or timeout) was asked: the next checkpoint raises."""
        return self._signals.stop_kind is not None

    @property
    def progress(self) -> Progress | None:
        """The progress this task last reported."""
        return self._signals.progress


def task_of(token: CancellationToken) -> str:
    """The id of the task ``token`` belongs to, for the node (a stalled loop names it)."""
    return token._signals.task_id
