"""``StoredTask``: a handle on a task this node does not hold, following it in the store.
A submit whose dedupe key a task of another node (or process) holds answers with one."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import TYPE_CHECKING

from ..errors import TaskNotFound, TaskUnsuccessful, WaitTimeout
from ..model import JSONValue, TaskSnapshot, TaskStatus

if TYPE_CHECKING:
    from ..stores.protocol import TaskStore

__all__ = ["StoredTask"]

POLL = 0.05
"""Seconds between reads of the store while waiting."""


class StoredTask:
    """``task_id``, ``status``, ``snapshot()``, ``wait()``, ``result()`` and their awaited
    twins, as on a ``TaskRun``, each read from the store (control it through the node:
    ``node.stop(task_id)``, ...)."""

    __slots__ = ("_store", "task_id")

    def __init__(self, task_id: str, store: TaskStore) -> None:
        self.task_id = task_id
        self._store = store

    def __repr__(self) -> str:
        return f"StoredTask({self.task_id!r})"

    def snapshot(self) -> TaskSnapshot:
        """The task as the store holds it now."""
        found = self._store.get(self.task_id)
        if found is None:
            raise TaskNotFound(f"no task {self.task_id} in {self._store!r} (pruned?)")
        return found

    @property
    def status(self) -> TaskStatus:
        return self.snapshot().status

    def done(self) -> bool:
        return self.snapshot().is_terminal

    def wait(self, timeout: float | None = None) -> TaskSnapshot:
        """Read the store until the task is terminal; its final snapshot.
        ``WaitTimeout`` if it is not within ``timeout`` seconds."""
        deadline = time.monotonic() + (math.inf if timeout is None else timeout)
        tick = threading.Event()
        while True:
            snapshot = self.snapshot()
            if snapshot.is_terminal:
                return snapshot
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"task {self.task_id} still {snapshot.status.value} after {timeout}s"
                )
            tick.wait(POLL)

    def result(self, timeout: float | None = None) -> JSONValue:
        """The task's return value; ``TaskUnsuccessful`` if it did not succeed."""
        final = self.wait(timeout)
        if final.status is not TaskStatus.SUCCEEDED:
            raise TaskUnsuccessful(final)
        return final.outcome

    async def wait_async(self, timeout: float | None = None) -> TaskSnapshot:
        return await asyncio.to_thread(self.wait, timeout)

    async def aresult(self, timeout: float | None = None) -> JSONValue:
        return await asyncio.to_thread(self.result, timeout)
