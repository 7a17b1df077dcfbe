"""``AsyncRunner``: the node's event loop, where ``async def`` tasks run (docs/design.md,
"Async tasks").

One loop thread, started with the node's first async run, carries up to ``max_async``
attempts at once, apart from the worker threads. A worker that takes an async run from
the dispatcher hands it here at once and goes back for the next; the run's dispatcher
slot (and its bucket's count) is released when the attempt ends, so per-bucket limits
count both kinds. A stop asks the task first (``acheckpoint`` raises); once its grace
runs out, or at once for a timeout, the runner *cancels* the attempt: ``CancelledError``
at its current ``await``, and the task ends as the stop or timeout says with
``carrier_may_run=False``: it cannot run on. A coroutine that catches every
cancellation and goes on awaiting is abandoned by the supervisor (``CANCEL_WAIT``
after a stop's cancellation, ``timeout_grace`` after a timeout's): ended as asked,
``carrier_may_run=True``, its slot freed only when it does end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from contextvars import Token
from typing import TYPE_CHECKING, Any

from .. import observe
from ..current import enter, leave
from ..errors import StopRequested
from ..loops import ThreadWatch, keep_running
from ..run.life import CANCEL_WAIT
from ..run.token import CancellationToken, task_of

if TYPE_CHECKING:
    from ..run.life import Run

__all__ = ["AsyncRunner", "attempt"]

log = logging.getLogger("chongming_task.aio")

BEAT = 0.05
"""Seconds between the loop's heartbeats (the watchdog compares)."""
STALL = 0.1
"""A loop that misses its heartbeat by this much is blocked (about 100 ms)."""


async def attempt(run: Run) -> None:
    """One attempt of an ``async def`` task, on the node's loop: the sync path's steps,
    its function awaited, its writes handed to the node's writer."""
    if not run.begin_attempt():
        return
    watch = observe.watcher
    seen = None if watch is None else watch.began(run)
    raised: BaseException | None = None
    try:
        result = await run.call()
    except asyncio.CancelledError as exc:
        raised = exc
        _ends_as_asked(run)
        return  # the attempt is over; the runner's own task ends here
    except BaseException as exc:
        raised = exc
        run.ended_by(exc, soon=True)
        if not isinstance(exc, Exception):
            raise
        return
    finally:
        if seen is not None and raised is not None:
            seen.ended(raised)
    if run.cancel_asked:  # it swallowed the cancellation and returned
        log.warning(
            "task %s (%s) swallowed its cancellation and returned; it ends as its stop or "
            "timeout said",
            run.task_id,
            run.name,
        )
        _ends_as_asked(run)
    else:
        run.settle(result)
    if seen is not None:
        seen.ended(None)


def _ends_as_asked(run: Run) -> None:
    """A cancelled attempt ends as the stop or timeout that cancelled it says (a stop,
    should it have been cancelled from outside the runtime): it cannot run on."""
    run.signals.request_stop("stop", "cancelled")  # keeps a stop or timeout asked before
    run.cancel_asked = True  # it ended at an await, not at a checkpoint of its own
    run.ended_by(StopRequested(f"task {run.task_id}: cancelled"), soon=True)


class AsyncRunner:
    """The loop thread and the attempts on it. ``hand`` is called from worker threads;
    ``released(run)`` is called once per run when its attempt is over (the dispatcher's
    slot and the registry's active set)."""

    def __init__(
        self,
        *,
        owner: str,
        max_async: int,
        released: Callable[[Run], None],
        crashed: Callable[[Run, BaseException], None],
    ) -> None:
        self.name = f"chongming-async[{owner}]"
        self.thread_watch: ThreadWatch | None = None
        self._max = max_async
        self._released = released
        self._crashed = crashed
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._inbox: list[Run] = []  # handed, not yet taken by the loop
        self._waking = False  # a wake-up to take them is on its way
        self._waiting = 0  # taken by the loop, not yet begun (the loop's thread only)
        self._slots: asyncio.Semaphore | None = None
        self._tick = 0.0  # monotonic time the loop last ran its heartbeat
        self.on_stall: Callable[[], None] | None = None
        """Told each time a task blocks the loop past ``STALL`` (the node's health
        counts them)."""

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Nothing until the first async run: a node that never has one has no loop."""

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is not None:  # started (every hand after the first): no lock, no wait
            return loop
        with self._lock:
            if self._thread is None:
                target = keep_running(
                    "async", self._run, stopping=lambda: self._stopping, watch=self.thread_watch
                )
                self._thread = threading.Thread(target=target, name=self.name, daemon=True)
                self._thread.start()
        self._ready.wait()
        assert self._loop is not None
        return self._loop

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._slots = asyncio.Semaphore(self._max)
        self._loop = loop
        self._tick = time.monotonic()
        loop.call_soon(self._heartbeat)
        watchdog = keep_running(
            "async watchdog", self._watch, stopping=lambda: self._stopping, watch=self.thread_watch
        )
        threading.Thread(target=watchdog, name=f"{self.name}-watchdog", daemon=True).start()
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:  # a coroutine that refuses its cancellation is not waited for
                loop.run_until_complete(asyncio.wait(pending, timeout=CANCEL_WAIT))
            loop.close()

    def _heartbeat(self) -> None:
        self._tick = time.monotonic()
        loop = self._loop
        if loop is not None and not self._stopping:
            loop.call_later(BEAT, self._heartbeat)

    def _watch(self) -> None:
        """Notice a task that blocks the loop (sync work inside ``async def``): past
        ``STALL`` seconds, name it (found twice, a moment apart, in the same frame: the
        loop busy with many tasks at once is not one task blocking it) and, once the loop
        runs again, say for how long."""
        pause = threading.Event()
        while not self._stopping:
            pause.wait(BEAT)
            last = self._tick
            if time.monotonic() - last - BEAT <= STALL:
                continue
            first = self._blocking()
            pause.wait(BEAT / 2)
            second = self._blocking() if self._tick == last else None
            while not self._stopping and self._tick == last:
                pause.wait(BEAT / 2)
            blocked = (self._tick if self._tick != last else time.monotonic()) - last - BEAT
            if first is None or first != second:
                log.debug("the event loop ran %.2f s behind (many tasks at once)", blocked)
                continue
            if self.on_stall is not None:
                self.on_stall()
            log.warning(
                "%s blocked the node's event loop for about %.2f s: blocking work inside "
                "an async def task stalls every other one (await it, or make it a thread "
                "task)",
                first[0],
                blocked,
            )

    def _blocking(self) -> tuple[str, int] | None:
        """The task the loop thread is in, and its frame, from the thread's frames (a
        task's own frame holds its token, whatever its name); ``None`` outside any task."""
        thread = self._thread
        frame = None if thread is None else sys._current_frames().get(thread.ident or -1)
        while frame is not None:
            for value in frame.f_locals.values():
                if isinstance(value, CancellationToken):
                    return f"task {task_of(value)} ({frame.f_code.co_name})", id(frame)
            frame = frame.f_back
        return None

    def hand(self, run: Run) -> None:
        """Carry ``run``'s attempt on the loop (from any thread, never waiting for it).
        Runs handed while the loop has not yet taken the earlier ones ride the same
        wake-up (one write to the loop's self-pipe for a burst, not one a run)."""
        loop = self._ensure_loop()
        with self._lock:
            gone = self._stopping or loop.is_closed()
            if not gone:
                self._inbox.append(run)
                if self._waking:
                    return
                self._waking = True
        if gone:  # handed after the node's close began: never left active
            self._refuse([run])
            return
        try:
            loop.call_soon_threadsafe(self._take)
        except RuntimeError:  # the loop closed meanwhile
            with self._lock:
                runs, self._inbox = self._inbox, []
            self._refuse(runs)

    def _refuse(self, runs: list[Run]) -> None:
        for run in runs:
            self._crashed(run, RuntimeError("the node's event loop has stopped"))
            self._released(run)

    def _take(self) -> None:
        with self._lock:
            runs, self._inbox = self._inbox, []
            self._waking = False
        create = asyncio.get_running_loop().create_task
        self._waiting += len(runs)
        for run in runs:
            self._tasks[run.task_id] = create(self._carry(run))

    def backlog(self) -> bool:
        """Whether runs wait on the loop (handed, or not yet begun): a write queued
        behind may then ride with theirs, as with the dispatcher's backlog."""
        return self._waiting > 0 or bool(self._inbox)

    async def _carry(self, run: Run) -> None:
        assert self._slots is not None
        try:
            async with self._slots:
                self._waiting -= 1
                mark: Token[Any] | None = enter(run)  # this task's context: current(), logs
                try:
                    await attempt(run)
                except GeneratorExit:
                    # Closed, never finished: a coroutine that refused its cancellation,
                    # left pending when the loop closed and destroyed at the interpreter's
                    # exit. Its run ended then (abandoned); this is no longer the task's
                    # context to leave, and nothing crashed.
                    mark = None
                    raise
                finally:
                    if mark is not None:
                        leave(mark)
        except GeneratorExit:
            raise
        except BaseException as exc:
            self._crashed(run, exc)
        finally:
            self._tasks.pop(run.task_id, None)
            self._released(run)

    def cancel(self, run: Run, *, after: float = 0.0) -> None:
        """Cancel ``run``'s attempt now, or ``after`` seconds if it has not ended by then
        (a stop's grace). Nothing if it runs on no loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            if after > 0:
                loop.call_soon_threadsafe(loop.call_later, after, self._cancel_now, run)
            else:
                loop.call_soon_threadsafe(self._cancel_now, run)
        except RuntimeError:  # the loop closed meanwhile
            return

    def _cancel_now(self, run: Run) -> None:
        task = self._tasks.get(run.task_id)
        if task is not None and not task.done() and not run.done():
            run.cancel_asked = True
            task.cancel()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(loop.stop)

    def join(self, timeout: float | None) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
