"""Late truth (docs/design.md, "Late truth"): ``LateReport``, what a node reported of a
task after the store had ended it without it, kept beside the final status."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .model import Failure, JSONValue, TaskStatus, utc

__all__ = ["LateReport"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LateReport:
    """A task's end as its own process saw it, reported after the store had ended the
    task without it (its buckets' owner marked it ``lost`` while the node was cut off).

    A record, never a change of the task: ``lost`` stays final, and this says that the
    work did finish, when, and with what result or error, so nobody re-runs finished
    work believing its result unknown."""

    task_id: str
    reported_by: str
    """The node (its owner name) that ran the task."""
    reported_at: datetime
    status: TaskStatus
    """The status the run reached in its process (``succeeded``, ``failed``, ...)."""
    stored_status: TaskStatus
    """What the store held instead when the report was made (``lost``)."""
    ended_at: datetime | None = None
    outcome: JSONValue = None
    failure: Failure | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "reported_at", utc(self.reported_at, "reported_at"))
        if self.ended_at is not None:
            object.__setattr__(self, "ended_at", utc(self.ended_at, "ended_at"))

    def summary(self) -> str:
        """One line: what the node reported, and when."""
        what = (
            f"result {self.outcome!r}"
            if self.status is TaskStatus.SUCCEEDED
            else (self.failure.message if self.failure is not None else "no detail")
        )
        when = f" at {self.ended_at:%Y-%m-%d %H:%M:%S}" if self.ended_at is not None else ""
        return (
            f"{self.reported_by} reported it {self.status.value}{when} after the store had "
            f"it {self.stored_status.value}: {what}"
        )
