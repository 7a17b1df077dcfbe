"""Finding a task by what a person types: its full id, or a unique prefix of it (the CLI
and the dashboard both take short ids), in either case."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from .model import TaskQuery, TaskSnapshot, TaskStatus
from .states import WAITING
from .stores import codec
from .stores.capabilities import Capabilities
from .stores.protocol import TaskStore

__all__ = [
    "MIN_PREFIX",
    "AmbiguousId",
    "find_pipeline_run",
    "find_task",
    "holds_of",
    "read_briefly",
    "with_held",
]

MIN_PREFIX = 6
"""The shortest id prefix resolved (shorter ones are too likely to clash)."""


class AmbiguousId(LookupError):
    """A prefix that matches several tasks; ``candidates`` are the first few."""

    def __init__(self, message: str, candidates: list[TaskSnapshot]) -> None:
        super().__init__(message)
        self.candidates = candidates


def find_task(
    store: TaskStore, given: str, where: str, *, shown: int = 5, brief: bool = False
) -> TaskSnapshot:
    """The task ``given`` names: its full id, or a unique prefix of at least
    ``MIN_PREFIX`` characters. ``LookupError`` (one line, naming ``where``) when there is
    none; ``AmbiguousId`` naming the candidates when the prefix fits several. ``brief``:
    read as a list reads it (no result, no traceback: ``TaskQuery.brief``), to find the
    task whatever its result's size."""
    snapshot = store.get(given) if not brief else read_briefly(store, given)
    if snapshot is not None:
        return snapshot
    if given != given.lower():  # the ids made here are lower-case hex; a person may shout
        return find_task(store, given.lower(), where, shown=shown, brief=brief)
    if len(given) < MIN_PREFIX:
        raise LookupError(
            f"no task {given} in {where} (an id prefix needs {MIN_PREFIX}+ characters)"
        )
    with codec.left_out() as unread:
        found = store.query(TaskQuery(id_prefix=given, limit=shown + 1, brief=brief))
    if not found and unread:
        raise unread[0]  # the task is there, but cannot be read: say that, not "none"
    if not found:
        raise LookupError(f"no task {given} in {where}")
    if len(found) == 1:
        return found[0]
    listed = ", ".join(f"{s.task_id} ({s.name})" for s in found[:shown])
    more = " and more" if len(found) > shown else ""
    raise AmbiguousId(f"id prefix {given} is ambiguous: it matches {listed}{more}", found[:shown])


def read_briefly(store: TaskStore, task_id: str) -> TaskSnapshot | None:
    """The task whose id is ``task_id``, read as a list reads it (no result, no
    traceback: ``TaskQuery.brief``); ``None``: none has it."""
    with codec.left_out() as unread:
        found = store.query(TaskQuery(id_prefix=task_id, limit=2, brief=True))
    exact = next((s for s in found if s.task_id == task_id), None)
    if exact is None and any(exc.task_id == task_id for exc in unread):
        raise next(exc for exc in unread if exc.task_id == task_id)
    return exact


def find_pipeline_run(store: TaskStore, given: str) -> str | None:
    """The pipeline run ``given`` names: itself when a task carries that run id, else the
    one run whose id starts with it (a prefix of ``MIN_PREFIX``+ characters); ``None``
    when none does. A prefix several runs share is a ``LookupError`` naming them."""
    if store.query(TaskQuery(pipeline_run_id=given, limit=1)):
        return given
    if given != given.lower():  # as find_task
        return find_pipeline_run(store, given.lower())
    if len(given) < MIN_PREFIX:
        return None
    found = sorted(
        {s.pipeline_run_id or "" for s in store.query(TaskQuery(pipeline_prefix=given, limit=500))}
    )
    if len(found) > 1:
        raise LookupError(f"pipeline prefix {given} is ambiguous: it matches {', '.join(found)}")
    return found[0] if found else None


def holds_of(caps: Capabilities, snapshots: list[TaskSnapshot]) -> dict[str, datetime]:
    """Which of ``snapshots`` a pause holds before their start, and since when (only
    a waiting task can be held: none asked for when none waits)."""
    waiting = [s.task_id for s in snapshots if s.status in WAITING]
    return caps.holds(task_ids=waiting) if waiting else {}


def with_held(
    caps: Capabilities, query: TaskQuery, found: list[TaskSnapshot]
) -> list[TaskSnapshot]:
    """``found`` (what ``query`` read) and, where the query asks for ``paused`` tasks,
    the tasks a pause holds before their start that match the rest of it (``queued``
    or ``pending`` in the store: docs/design.md, "A pause before the start"), in the
    query's order and within its limit."""
    if query.statuses is None or TaskStatus.PAUSED not in query.statuses:
        return found
    ids = list(caps.holds())
    if not ids:
        return found
    waiting = replace(query, statuses=WAITING, limit=None)
    held = [s for s in (caps.store.get(t) for t in ids) if s is not None and waiting.matches(s)]
    if not held:
        return found
    merged = sorted(
        {s.task_id: s for s in [*found, *held]}.values(),
        key=lambda s: (s.created_at, s.task_id),
        reverse=query.newest_first,
    )
    return merged if query.limit is None else merged[: query.limit]
