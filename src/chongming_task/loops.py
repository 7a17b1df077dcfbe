"""Background loops: ``Service`` (what is started and stopped in one place),
``LoopService`` (``run_once()`` on a named thread until stopped) and ``Pass`` (what one
pass did). Beneath every room that runs a thread: a node's services, a run's writers."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .errors import StoreError

__all__ = ["FaultSink", "LoopService", "Pass", "Service", "ThreadWatch", "keep_running"]

log = logging.getLogger("chongming_task.services")


class Service(Protocol):
    """What the controller starts and stops."""

    name: str

    def start(self) -> None: ...

    def stop(self) -> None:
        """Ask the service to end (no waiting)."""
        ...

    def join(self, timeout: float | None) -> None: ...


class FaultSink(Protocol):
    """Where a loop reports a store fault (a node's ``FaultLog``: one line an episode)."""

    def failed(self, what: str, exc: BaseException) -> None: ...


class ThreadWatch(Protocol):
    """Told when a service thread dies and when it is started again (a node's health)."""

    def died(self, service: str, exc: BaseException) -> None: ...

    def restarted(self, service: str) -> None: ...


RESTART_FIRST = 0.1
RESTART_MOST = 30.0
"""A dead service thread is started again after 0.1 s, doubling up to 30 s."""


def keep_running(
    service: str,
    body: Callable[[], None],
    *,
    stopping: Callable[[], bool],
    watch: ThreadWatch | None = None,
) -> Callable[[], None]:
    """A thread target that runs ``body`` and, if it ends by an exception while the
    service is not stopping, logs it at CRITICAL and runs ``body`` again after a backoff
    (telling ``watch``): a background thread never dies in silence. ``body`` returning
    is the service ending as asked."""

    def target() -> None:
        delay = RESTART_FIRST
        while True:
            try:
                body()
                return
            except BaseException as exc:
                if stopping():
                    return
                log.critical(
                    "%s: thread died (%s: %s); starting it again in %.1f s",
                    service,
                    type(exc).__name__,
                    exc,
                    delay,
                    exc_info=exc,
                )
                if watch is not None:
                    watch.died(service, exc)
            # The pause itself may be what fails (a faulty clock): never die of it.
            with contextlib.suppress(BaseException):
                threading.Event().wait(delay)
            delay = min(delay * 2, RESTART_MOST)
            if stopping():
                return
            if watch is not None:
                watch.restarted(service)

    return target


@dataclass(frozen=True, slots=True)
class Pass:
    """What one pass of a service did: how many things it handled (leases renewed,
    commands completed, schedules fired...), and how long to wait before the next
    (``None``: the service's interval)."""

    done: int = 0
    wait: float | None = None


class LoopService:
    """A loop on one named thread: ``run_once()``, then wait up to the ``Pass``'s
    ``wait`` (``None``: ``interval``) or until ``wake()``; until ``stop()``. A daemon
    thread: a program that never closes its controller must still exit (the controller
    is closed at interpreter exit, which stops and joins this loop first).

    A step that raises is logged and the loop goes on: a background loop never dies
    of one bad pass.
    """

    name = "service"
    interval = 1.0
    service = ""
    """The service's name in a node's health (``name`` when empty)."""
    thread_watch: ThreadWatch | None = None
    """Told when the thread dies and is started again (a node's health)."""
    faults: FaultSink | None = None
    """Told of a pass that failed on a store fault (else it is logged with its trace)."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self, now: float | None = None) -> Pass:
        """One pass at ``now`` (the service's clock when ``None``): what it did."""
        raise NotImplementedError

    def start(self) -> None:
        if self._thread is None:
            target = keep_running(
                self.service or self.name,
                self._loop,
                stopping=self._stopped.is_set,
                watch=self.thread_watch,
            )
            self._thread = threading.Thread(target=target, name=self.name, daemon=True)
            self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread is not None

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    def join(self, timeout: float | None) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopped.is_set():
            try:
                delay = self.run_once().wait
            except StoreError as exc:
                if self.faults is None:
                    log.exception("%s: pass failed; continuing", self.name)
                else:
                    self.faults.failed(self.name, exc)
                delay = None
            except Exception:
                log.exception("%s: pass failed; continuing", self.name)
                delay = None
            if self._stopped.is_set():
                return
            self._wake.wait(self.interval if delay is None else delay)
            self._wake.clear()
