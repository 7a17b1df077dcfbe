"""``PipelineRunner``: the node service that reacts to pipeline nodes ending
(``chongming_task.pipelines`` holds the pipelines and their runs): a node's end may
queue, cancel or stop other nodes of its run, done here on a thread of its own.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING

from ..loops import Pass, ThreadWatch, keep_running

if TYPE_CHECKING:
    from ..run.life import Run

__all__ = ["PipelineRunner"]

log = logging.getLogger("chongming_task.pipelines")


class PipelineRunner:
    """Reacts to pipeline nodes ending, one at a time, on a thread of its own, holding no
    run's lock: a node's end may enqueue, cancel or stop other nodes, and doing that inside
    the ending node's lock would order two run locks."""

    def __init__(self, *, owner: str) -> None:
        self.name = f"chongming-pipelines[{owner}]"
        self._events: queue.SimpleQueue[Run | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.thread_watch: ThreadWatch | None = None
        """Told when the thread dies and is started again (a node's health)."""

    def node_ended(self, run: Run) -> None:
        """Called by the run's transition to a terminal status (any thread)."""
        self._events.put(run)

    def run_once(self, now: float | None = None) -> Pass:
        """React to every node ended so far, in order, without waiting; ``done``: how
        many (a test drives it with no thread)."""
        reacted = 0
        while True:
            try:
                run = self._events.get_nowait()
            except queue.Empty:
                return Pass(done=reacted)
            if run is None:  # stop() asked for the thread's end: keep it for the loop
                self._events.put(None)
                return Pass(done=reacted)
            self._react(run)
            reacted += 1

    def _react(self, run: Run) -> None:
        try:
            if run.pipeline is not None:
                run.pipeline.node_finished(run)
        except Exception:
            log.exception("pipeline reaction to task %s failed", run.task_id)

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                # Daemon, as every service thread: see LoopService.
                target = keep_running(
                    "pipelines",
                    self._loop,
                    stopping=lambda: self._stopping,
                    watch=self.thread_watch,
                )
                self._thread = threading.Thread(target=target, name=self.name, daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            run = self._events.get()  # blocks: a node's end comes at any moment
            if run is None:
                return
            self._react(run)

    def stop(self) -> None:
        self._stopping = True
        self._events.put(None)

    def join(self, timeout: float | None) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
