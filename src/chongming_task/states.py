"""The one table of legal status transitions. Everything else asks this module.

Reading the table: a task is created ``queued`` (or ``pending`` while it waits for
pipeline dependencies), a worker takes it ``starting`` then ``running``; pause goes
``pausing`` until the task acknowledges at a checkpoint (``paused``); stop and cancel of a
running task go through ``stopping``; a retry sends it back to ``queued``. ``lost`` is
written by ``reconcile()`` for a task whose supervisor vanished.
"""

from __future__ import annotations

from .errors import IllegalTransition
from .model import _TERMINAL
from .model import TaskStatus as S

__all__ = [
    "ACTIVE",
    "NON_TERMINAL",
    "PAUSE_HELD",
    "SHOWS_PROGRESS",
    "STOPPABLE",
    "TERMINAL",
    "TRIGGERS_FAIL_FAST",
    "WAITING",
    "WORST_FIRST",
    "check",
    "is_legal",
    "legal_targets",
]

TERMINAL: frozenset[S] = _TERMINAL
ACTIVE: frozenset[S] = frozenset({S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED, S.STOPPING})
"""Statuses in which a carrier (thread) is executing the task."""
WAITING: frozenset[S] = frozenset({S.PENDING, S.QUEUED})
"""Statuses of a task that has not started (a stop cancels it at once)."""
NON_TERMINAL: frozenset[S] = ACTIVE | WAITING
STOPPABLE: frozenset[S] = frozenset({S.RUNNING, S.PAUSING, S.PAUSED})
"""Statuses from which a stop, cancel or timeout goes through ``stopping``."""
PAUSE_HELD: frozenset[S] = frozenset({S.PAUSING, S.PAUSED})
"""A pause was asked for and not yet lifted (acknowledged or not)."""
SHOWS_PROGRESS: frozenset[S] = frozenset({S.RUNNING, S.PAUSED})
"""Statuses whose progress bar a live view shows."""
TRIGGERS_FAIL_FAST: frozenset[S] = frozenset({S.FAILED, S.LOST})
"""A pipeline node ending so stops a ``fail_fast`` run; ``cancelled`` never does (no
chain reaction of cancels: docs/design.md, "Pipelines")."""
WORST_FIRST: tuple[S, ...] = (S.FAILED, S.LOST, S.STOPPED, S.CANCELLED)
"""Terminal statuses other than ``succeeded``, worst first (a pipeline's outcome)."""

_LEGAL: dict[S, frozenset[S]] = {
    S.PENDING: frozenset({S.QUEUED, S.CANCELLED, S.LOST}),
    S.QUEUED: frozenset({S.STARTING, S.CANCELLED, S.LOST}),
    S.STARTING: frozenset({S.RUNNING, S.STOPPED, S.CANCELLED, S.FAILED, S.LOST}),
    S.RUNNING: frozenset({S.PAUSING, S.STOPPING, S.SUCCEEDED, S.FAILED, S.QUEUED, S.LOST}),
    S.PAUSING: frozenset(
        {S.PAUSED, S.RUNNING, S.STOPPING, S.SUCCEEDED, S.FAILED, S.QUEUED, S.LOST}
    ),
    S.PAUSED: frozenset({S.RUNNING, S.STOPPING, S.LOST}),
    S.STOPPING: frozenset({S.STOPPED, S.CANCELLED, S.SUCCEEDED, S.FAILED, S.LOST}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.STOPPED: frozenset(),
    S.CANCELLED: frozenset(),
    S.LOST: frozenset(),
}


def is_legal(from_status: S, to_status: S) -> bool:
    return to_status in _LEGAL[from_status]


def check(task_id: str, from_status: S, to_status: S) -> None:
    """Raise ``IllegalTransition`` unless ``from_status -> to_status`` is in the table."""
    if to_status not in _LEGAL[from_status]:
        raise IllegalTransition(
            f"task {task_id}: {from_status.value} -> {to_status.value} is not a legal transition"
        )


def legal_targets(from_status: S) -> frozenset[S]:
    return _LEGAL[from_status]


LOSABLE: frozenset[S] = frozenset(s for s in S if S.LOST in _LEGAL[s])
"""The statuses the table lets ``reconcile`` mark ``lost`` (every unfinished one)."""
