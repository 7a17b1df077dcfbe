"""``StoredTask``: a handle on a task this node does not hold, following it in the store.
A submit whose dedupe key a task of another node (or process) holds answers with one.

Every read goes to the store, so each is a call with its awaited twin (``a``-prefixed;
``await_`` for ``wait``); control goes through the node, as ``node.stop(task_id)``."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import TYPE_CHECKING

from ..errors import TaskNotFound, TaskUnsuccessful, WaitTimeout
from ..model import JSONValue, TaskSnapshot, TaskStatus, Transition
from .handle import Controls

if TYPE_CHECKING:
    from ..stores.protocol import TaskStore
    from .handle import Control

__all__ = ["StoredTask"]

POLL = 0.05
"""Seconds between reads of the store while waiting."""


class StoredTask(Controls):
    """A task held elsewhere: ``task_id``, ``snapshot()``, ``history()``, ``done()``,
    ``wait()``, ``result()`` and control, as on a ``TaskRun``, each read from (or sent
    through) the store, each with its awaited twin."""

    __slots__ = ("_control", "_store", "task_id")

    def __init__(self, task_id: str, store: TaskStore, control: Control) -> None:
        self.task_id = task_id
        self._store = store
        self._control = control

    def __repr__(self) -> str:
        return f"StoredTask({self.task_id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoredTask) and other.task_id == self.task_id

    def __hash__(self) -> int:
        return hash(self.task_id)

    # -- reading -------------------------------------------------------------------------------

    def snapshot(self) -> TaskSnapshot:
        """The task as the store holds it now; ``TaskNotFound`` once it is gone."""
        found = self._store.get(self.task_id)
        if found is None:
            raise TaskNotFound(f"no task {self.task_id} in {self._store!r} (pruned?)")
        return found

    async def asnapshot(self) -> TaskSnapshot:
        return await asyncio.to_thread(self.snapshot)

    def history(self) -> list[Transition]:
        """The task's trail as the store holds it."""
        return self._store.history(self.task_id)

    async def ahistory(self) -> list[Transition]:
        return await asyncio.to_thread(self.history)

    def done(self) -> bool:
        """Whether the store holds the task ended."""
        return self.snapshot().is_terminal

    async def adone(self) -> bool:
        return await asyncio.to_thread(self.done)

    # -- waiting -------------------------------------------------------------------------------

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

    async def await_(self, timeout: float | None = None) -> TaskSnapshot:
        return await asyncio.to_thread(self.wait, timeout)

    def result(self, timeout: float | None = None) -> JSONValue:
        """The task's return value; ``TaskUnsuccessful`` if it did not succeed."""
        final = self.wait(timeout)
        if final.status is not TaskStatus.SUCCEEDED:
            raise TaskUnsuccessful(final)
        return final.outcome

    async def aresult(self, timeout: float | None = None) -> JSONValue:
        return await asyncio.to_thread(self.result, timeout)
