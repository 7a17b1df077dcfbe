"""A run's trail: its transitions as one flat tuple, and each status as stores write it.

What a held run (``run.writes``) and the in-memory store keep of a task's transitions,
and how a ``Transition`` becomes its items and back.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from .model import TaskStatus, Transition, trusted_transition

__all__ = [
    "STATUS_TEXT",
    "TRAIL_TEXT",
    "TRAIL_WIDTH",
    "Trail",
    "trail_items",
    "trail_merged",
    "trail_transitions",
]

Trail = tuple[Any, ...]
"""Transitions as a run or the in-memory store keeps them: one flat tuple, ``TRAIL_WIDTH``
items a transition, in version order: ``version``, ``from_status`` and ``to_status`` as
text, ``at``, ``reason``, ``actor`` (the task id is its holder's).

Why not a list of ``Transition``: a node holds every run its callers hold, and each kept
object of a class is one more for every garbage collection to walk (a class instance is
tracked for life). A tuple of text, numbers and datetimes is not: the collector stops
tracking it the first time it looks. A held no-op run kept a list and four transitions,
and the in-memory store a dict and the same four: 12 tracked objects a held run became
6. Flat, not a tuple of rows: each row would be one more object
allocated, and allocations are what start a collection."""

TRAIL_WIDTH = 6

STATUS_TEXT: dict[TaskStatus, str] = {status: status.value for status in TaskStatus}
"""Each status as a ``Trail`` holds it and a store writes it (a lookup: an Enum's
``.value`` is a descriptor call)."""
_STATUS_OF_TEXT: dict[str, TaskStatus] = {text: status for status, text in STATUS_TEXT.items()}
TRAIL_TEXT: dict[TaskStatus | None, str | None] = {None: None}
"""``STATUS_TEXT`` with a first transition's ``from_status`` (``None``)."""
TRAIL_TEXT.update(STATUS_TEXT.items())


def trail_items(transition: Transition) -> Trail:
    """``transition``'s items of a ``Trail``."""
    text = TRAIL_TEXT
    return (
        transition.version,
        text[transition.from_status],
        text[transition.to_status],
        transition.at,
        transition.reason,
        transition.actor,
    )


def trail_merged(trail: Trail, transitions: Iterable[Transition]) -> Trail:
    """``trail`` with each of ``transitions`` whose version it does not hold yet (the
    one it holds stays: appends are idempotent), in version order."""
    width = TRAIL_WIDTH
    for transition in transitions:
        version = transition.version
        if not trail or trail[len(trail) - width] < version:  # the common case: after the last
            trail += trail_items(transition)
            continue
        versions = trail[::width]
        if version in versions:
            continue
        at = bisect.bisect(versions, version) * width
        trail = trail[:at] + trail_items(transition) + trail[at:]
    return trail


def trail_transitions(task_id: str, trail: Trail, since_version: int = 0) -> list[Transition]:
    """The ``Transition`` objects of task ``task_id``'s ``trail`` past ``since_version``."""
    status = _STATUS_OF_TEXT
    return [
        trusted_transition(
            task_id=task_id,
            version=trail[i],
            from_status=None if trail[i + 1] is None else status[trail[i + 1]],
            to_status=status[trail[i + 2]],
            at=trail[i + 3],
            reason=trail[i + 4],
            actor=trail[i + 5],
        )
        for i in range(0, len(trail), TRAIL_WIDTH)
        if trail[i] > since_version
    ]
