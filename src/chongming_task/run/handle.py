"""``TaskRun``: the handle ``submit`` returns for a task this node holds. It shows the
user's part of the run: reading (status, snapshot, progress, history), waiting, and
control; the attempt, lease and write machinery stays in the node's ``Run``.

Every call that waits or touches the store has an awaited twin named with an ``a``
(``await_`` for ``wait``, ``await`` being Python's own word): the same arguments and
the same answer, the blocking part on a thread, so the caller's event loop never waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..model import CommandAction, ControlReceipt, JSONValue, Progress, TaskSnapshot, Transition
from ..model import TaskStatus as S

if TYPE_CHECKING:
    from .life import Run

__all__ = ["Control", "Controls", "TaskRun"]

Control = Callable[[str, CommandAction, "str | None"], ControlReceipt]
"""How a handle's control goes out: the node's router (to the run held here, or as a
command for the holder, judged after any command still pending for the task)."""


class Controls:
    """The controls both handles offer, ``TaskRun`` and ``StoredTask``: each a call of the
    node's router for the handle's ``task_id``, and its awaited twin."""

    __slots__ = ()

    task_id: str
    _control: Control

    def stop(self, reason: str | None = None) -> ControlReceipt:
        """Stop the task: a running one at its next checkpoint, a waiting one is
        cancelled now. The receipt says what it did (``stopping``, ``cancelled``,
        ``already-terminal``, ...), as ``node.stop`` does."""
        return self._control(self.task_id, CommandAction.STOP, reason)

    async def astop(self, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(self.stop, reason)

    def pause(self, reason: str | None = None) -> ControlReceipt:
        """Pause the task: a running one acknowledges at its next checkpoint
        (``pausing``), one that has not started is held until resumed
        (``pause-pending``)."""
        return self._control(self.task_id, CommandAction.PAUSE, reason)

    async def apause(self, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(self.pause, reason)

    def resume(self, reason: str | None = None) -> ControlReceipt:
        """Resume a paused (or held) task."""
        return self._control(self.task_id, CommandAction.RESUME, reason)

    async def aresume(self, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(self.resume, reason)

    def cancel(self, reason: str | None = None) -> ControlReceipt:
        """Cancel: a waiting task never runs; a running one stops and ends
        ``cancelled`` (never ``failed``)."""
        return self._control(self.task_id, CommandAction.CANCEL, reason)

    async def acancel(self, reason: str | None = None) -> ControlReceipt:
        return await asyncio.to_thread(self.cancel, reason)


class TaskRun(Controls):
    """A task this node holds: ``task_id``, ``status``, ``snapshot()``, ``wait()``,
    ``result()`` and control (``stop``, ``pause``, ``resume``, ``cancel``), each
    blocking call with its awaited twin. Two handles of one run are equal."""

    __slots__ = ("_control", "_run", "task_id")

    def __init__(self, run: Run, control: Control) -> None:
        self._run = run
        self._control = control
        self.task_id = run.task_id

    def __repr__(self) -> str:
        return f"<TaskRun {self.task_id} {self._run.name} {self._run.status.value}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskRun) and other._run is self._run

    def __hash__(self) -> int:
        return hash(self.task_id)

    # -- reading (this process's view: no store read) ------------------------------------------

    @property
    def name(self) -> str:
        return self._run.name

    @property
    def status(self) -> S:
        return self._run.status

    @property
    def bucket(self) -> int | None:
        return self._run.bucket

    @property
    def priority(self) -> int:
        """Its place in the node's queue: higher first (fixed at submit)."""
        return self._run.priority

    @property
    def concurrency_key(self) -> str | None:
        """What its task's ``max_per_key`` counts (fixed at submit)."""
        return self._run.concurrency_key

    @property
    def progress(self) -> Progress | None:
        """The progress the task last reported at a checkpoint."""
        return self._run.snapshot().progress

    def snapshot(self) -> TaskSnapshot:
        """This process's view of the task, with the latest progress and heartbeat."""
        return self._run.snapshot()

    def history(self) -> list[Transition]:
        """Every transition this process made, in order (the store's trail may be behind)."""
        return self._run.history()

    def done(self) -> bool:
        """Whether the task ended (and its end was written, or never will be)."""
        return self._run.done()

    @property
    def desynced(self) -> bool:
        """Another writer changed the task in the store: its writes stopped."""
        return self._run.desynced

    @property
    def written(self) -> bool:
        """Whether the store has every transition this process made (or never will:
        desynced)."""
        return self._run.written

    @property
    def write_error(self) -> BaseException | None:
        """Why the latest write of this task failed (``None``: none has)."""
        return self._run.write_error

    # -- waiting -------------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> TaskSnapshot:
        """Block until the task is terminal; its final snapshot: what the store holds (a
        desynced run's store may hold ``lost`` while it ended otherwise here: ``result()``
        says both). ``WaitTimeout`` if it is not terminal within ``timeout`` seconds."""
        return self._run.wait(timeout)

    async def await_(self, timeout: float | None = None) -> TaskSnapshot:
        """``wait()``, awaited."""
        if self._run.done():
            return self._run.wait(0)
        return await asyncio.to_thread(self._run.wait, timeout)

    def result(self, timeout: float | None = None) -> JSONValue:
        """The task's return value; ``TaskUnsuccessful`` if it did not succeed,
        ``TaskDesynced`` (one) if the store ended it without this process, whatever it
        came to here; ``WaitTimeout`` as ``wait``."""
        return self._run.result(timeout)

    async def aresult(self, timeout: float | None = None) -> JSONValue:
        """``result()``, awaited."""
        return await asyncio.to_thread(self._run.result, timeout)
