"""What a node writes to end a stored task it does not hold (reconcile's ``lost``, where
the store has no one-step mark (``SupportsMarkExpired``), and a doubtful create's
``cancelled``): the snapshot and its transition, checked by the one state table."""

from __future__ import annotations

from datetime import datetime

from .. import states
from ..model import Failure, TaskSnapshot, TaskStatus, Transition, trusted_transition
from ._supports import Creation, Verdict

__all__ = ["ended_mark", "lost_mark"]


def ended_mark(
    s: TaskSnapshot,
    to: TaskStatus,
    at: datetime,
    actor: str,
    reason: str,
    failure: Failure | None = None,
) -> Creation:
    """``s`` ended ``to`` at ``at`` (the one table checks the move), and its transition:
    written with a compare-and-set from ``s``'s version."""
    states.check(s.task_id, s.status, to)
    version = s.status_version + 1
    marked = s.evolve(status=to, status_version=version, ended_at=at, failure=failure)
    transition: Transition = trusted_transition(
        task_id=s.task_id,
        version=version,
        from_status=s.status,
        to_status=to,
        at=at,
        reason=reason,
        actor=actor,
    )
    return marked, transition


def lost_mark(s: TaskSnapshot, at: datetime, actor: str, verdict: Verdict) -> Creation:
    """The ``lost`` snapshot and transition reconcile writes for ``s``."""
    failure, reason = verdict(s.lease_owner)
    return ended_mark(s, TaskStatus.LOST, at, actor, reason, failure)
