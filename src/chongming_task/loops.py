"""Background loops: ``Service`` (what is started and stopped in one place),
``LoopService`` (``run_once()`` on a named thread until stopped) and ``Pass`` (what one
pass did). Beneath every room that runs a thread: a node's services, a run's writers."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Protocol

__all__ = ["LoopService", "Pass", "Service"]

log = logging.getLogger("chongming_task.services")


class Service(Protocol):
    """What the controller starts and stops."""

    name: str

    def start(self) -> None: ...

    def stop(self) -> None:
        """Ask the service to end (no waiting)."""
        ...

    def join(self, timeout: float | None) -> None: ...


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

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self, now: float | None = None) -> Pass:
        """One pass at ``now`` (the service's clock when ``None``): what it did."""
        raise NotImplementedError

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
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
            except Exception:
                log.exception("%s: pass failed; continuing", self.name)
                delay = None
            if self._stopped.is_set():
                return
            self._wake.wait(self.interval if delay is None else delay)
            self._wake.clear()
