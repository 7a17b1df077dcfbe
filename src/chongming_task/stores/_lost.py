"""What reconcile writes for a task it judges lost, where the store has no one-step
mark (``SupportsMarkExpired``): the snapshot and its transition, checked by the one
state table."""

from __future__ import annotations

from datetime import datetime

from .. import states
from ..model import TaskSnapshot, TaskStatus, Transition, trusted_transition
from ._supports import Creation, Verdict

__all__ = ["lost_mark"]


def lost_mark(s: TaskSnapshot, at: datetime, actor: str, verdict: Verdict) -> Creation:
    """The ``lost`` snapshot and transition reconcile writes for ``s`` (the one table
    checks the move)."""
    states.check(s.task_id, s.status, TaskStatus.LOST)
    failure, reason = verdict(s.lease_owner)
    version = s.status_version + 1
    marked = s.evolve(status=TaskStatus.LOST, status_version=version, ended_at=at, failure=failure)
    transition: Transition = trusted_transition(
        task_id=s.task_id,
        version=version,
        from_status=s.status,
        to_status=TaskStatus.LOST,
        at=at,
        reason=reason,
        actor=actor,
    )
    return marked, transition
