"""Every exception the library raises, under one root.

Control flow inside a task (the stop signal, a retry asked for) lives here too, beneath
the root, so that a blanket ``except ChongmingTaskError`` in user code sees everything we
raise.
"""

from __future__ import annotations

from typing import Generic, Protocol, Self, TypeVar

from .limits import MAX_DURATION

__all__ = [
    "ChongmingTaskError",
    "ConcurrencyConflict",
    "ConfigurationError",
    "ControllerClosed",
    "IllegalTransition",
    "InvalidValue",
    "Retry",
    "StopRequested",
    "StoreError",
    "StoreUnavailable",
    "TaskAlreadyExists",
    "TaskDesynced",
    "TaskNotFound",
    "TaskUnsuccessful",
    "UnknownTask",
    "UnreadableRow",
    "WaitTimeout",
]


class ChongmingTaskError(Exception):
    """Root of every error raised by chongming-task."""


class ConfigurationError(ChongmingTaskError, ValueError):
    """A setting or an argument is wrong; the message says which and how to fix it."""


class InvalidValue(ChongmingTaskError, ValueError):
    """A value handed over (a result, progress, a name, a tag, a key, a reason) is one the
    store could not hold; it was refused where it was handed over, and nothing was stored.
    """


class StoreError(ChongmingTaskError):
    """The store could not do what was asked: outage, corrupt file, closed store, ..."""


class UnreadableRow(StoreError):
    """A stored row this release cannot read: a value no writer of this store writes (a
    hand edit, a disk fault, another program). The message names the task and the
    field; a list read leaves the row out and says so, the rest of the store is read."""

    def __init__(self, message: str, *, task_id: str, field: str) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.field = field


class StoreUnavailable(StoreError):
    """The store cannot be reached right now (a database outage); the same call may work
    later. Raised at once while the store is known to be away, instead of waiting out a
    connection timeout per call."""


class TaskAlreadyExists(StoreError):
    """``create`` was given a task id that is already stored."""


class ConcurrencyConflict(ChongmingTaskError):
    """``save`` found another version than the one expected: a second writer exists.

    Never retried automatically: every task has exactly one writer, so a conflict is a
    design fault to surface, not a transient error to paper over.
    """

    @classmethod
    def version_mismatch(cls, task_id: str, expected: int, stored: int | None) -> Self:
        """The conflict for ``task_id``: ``stored`` is the stored version, ``None`` if the
        task is not stored at all."""
        found = "nothing" if stored is None else f"version {stored}"
        return cls(f"task {task_id}: expected version {expected}, stored {found}")


class TaskNotFound(ChongmingTaskError, LookupError):
    """No task with that id exists in the store."""


class UnknownTask(ChongmingTaskError, KeyError):
    """No task definition of that name is registered on this controller (a ``KeyError``:
    ``node.tasks[name]``)."""

    def __str__(self) -> str:  # KeyError's would quote the message
        return str(self.args[0]) if self.args else ""


class IllegalTransition(ChongmingTaskError):
    """The state machine refused a transition; nothing was applied."""


class ControllerClosed(ChongmingTaskError):
    """The controller was closed; it accepts no more work."""


class WaitTimeout(ChongmingTaskError, TimeoutError):
    """A wait for a task's outcome ran out of time; the task itself is unaffected."""


class _Failed(Protocol):
    @property
    def message(self) -> str: ...


class EndedTask(Protocol):
    """What ``TaskUnsuccessful`` says of a task (a ``TaskSnapshot`` is one). A protocol,
    so that this module, beneath every other, imports none of them."""

    @property
    def task_id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def failure(self) -> _Failed | None: ...


_Ended = TypeVar("_Ended", bound=EndedTask)


class TaskUnsuccessful(ChongmingTaskError, Generic[_Ended]):
    """``TaskRun.result()`` was asked for the result of a task that did not succeed;
    ``snapshot`` is the task's final ``TaskSnapshot``."""

    def __init__(self, snapshot: _Ended) -> None:
        failure = f": {snapshot.failure.message}" if snapshot.failure else ""
        super().__init__(
            f"task {snapshot.task_id} ({snapshot.name}) ended {snapshot.status}{failure}"
        )
        self.snapshot: _Ended = snapshot


class TaskDesynced(TaskUnsuccessful[_Ended]):
    """``TaskRun.result()`` of a run whose stored task another writer ended (its
    buckets' owner marked it ``lost`` while this node was cut off): ``snapshot`` is what
    the store holds, ``local`` what the task came to here, which was not recorded (a
    late report is kept beside the task instead)."""

    def __init__(self, snapshot: _Ended, local: _Ended) -> None:
        super().__init__(snapshot)
        self.local: _Ended = local
        self.args = (
            f"task {snapshot.task_id} ({snapshot.name}): the store holds {snapshot.status}; "
            f"here it ended {local.status}, which was not recorded (a late report is kept "
            "beside the task)",
        )


class StopRequested(ChongmingTaskError):
    """Raised by ``CancellationToken.checkpoint()`` when the task was asked to stop.

    Let it propagate out of the task function: the runtime turns it into ``stopped``,
    ``cancelled`` or ``failed`` (timeout), whichever was asked for.
    """


class Retry(ChongmingTaskError):
    """Raised by a task to run again ``after`` seconds from now without counting a
    failure: the attempt ends, the task waits ``queued`` (its trail says it asked, and
    ``reason``), and its retries are left as they were. A bad ``after`` is an
    ``InvalidValue`` where the ``Retry`` is made. (Celery's ``self.retry(countdown=)``,
    without the count.)"""

    def __init__(self, after: float = 0.0, reason: str | None = None) -> None:
        if (
            isinstance(after, bool)
            or not isinstance(after, int | float)
            or not 0 <= after <= MAX_DURATION
        ):
            raise InvalidValue(
                f"Retry(after=...) takes seconds from 0 to {MAX_DURATION}, got {after!r}"
            )
        if reason is not None and not isinstance(reason, str):
            raise InvalidValue(f"Retry(reason=...) takes text, got {reason!r}")
        super().__init__(after, reason)
        self.after = float(after)
        self.reason = reason

    def __str__(self) -> str:
        said = f"asked to run again in {self.after:g}s"
        return said if self.reason is None else f"{said}: {self.reason}"


class CarrierTerminated(StopRequested):
    """A stop (or timeout) carried out by force: the node ended the worker process
    carrying the attempt. The message says what happened (``its worker process 1234 was
    terminated``); the task ends as the stop asked, and nothing of it runs on."""


class CarrierCrashed(ChongmingTaskError):
    """The worker process carrying a task died on its own (a signal, an exit, the
    kernel's OOM killer): the attempt failed ``crashed``, retried by its policy."""
