"""Following a store's transitions from outside any node: what ``watch`` prints and what
the dashboard counts. The store keeps no global sequence of transitions, so each refresh
reads three things: the unfinished tasks of a query, the newest few tasks (one created and
finished between two refreshes still shows), and each task seen unfinished last time (its
ending shows once it leaves the unfinished set). A task's trail is read from the version
last seen, never twice; the first refresh starts from now.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .model import Progress, TaskQuery, TaskSnapshot, Transition
from .states import NON_TERMINAL
from .stores.protocol import TaskStore

__all__ = ["RECENT", "Change", "TransitionFeed"]

RECENT = 200
"""How many of the newest tasks each refresh reads to catch short-lived ones."""


@dataclass(frozen=True, slots=True)
class Change:
    """What one refresh found: new transitions (oldest first) and each task's name and
    latest snapshot, the unfinished tasks now and those whose progress moved, and whether
    more tasks were created since the last refresh than one refresh reads."""

    transitions: list[Transition]
    tasks: dict[str, TaskSnapshot]
    active: list[TaskSnapshot]
    progressed: list[TaskSnapshot]
    overflow: bool

    @property
    def names(self) -> dict[str, str]:
        return {task_id: s.name for task_id, s in self.tasks.items()}


class TransitionFeed:
    """Reads what changed since the last refresh. ``query`` selects the unfinished tasks
    to follow (default: all of them); several queries select their union."""

    def __init__(
        self,
        store: TaskStore,
        query: TaskQuery | Sequence[TaskQuery] | None = None,
        *,
        any_status: bool = True,
        active: Callable[[], list[TaskSnapshot]] | None = None,
    ) -> None:
        self._store = store
        given = [query] if query is None or isinstance(query, TaskQuery) else list(query)
        # A follower reads lists: no results, no tracebacks (TaskQuery.brief).
        queries = [
            dataclasses.replace(each or TaskQuery(statuses=NON_TERMINAL), brief=True)
            for each in given
        ]
        self._active = active or (lambda: [s for each in queries for s in store.query(each)])
        # The newest tasks, in whatever status (unless the caller asked for some).
        self._recent = [
            dataclasses.replace(
                each,
                statuses=None if any_status else each.statuses,
                newest_first=True,
                limit=RECENT,
            )
            for each in queries
        ]
        self._shown: dict[str, int] = {}  # task id -> last status version seen
        self._unfinished: set[str] = set()
        self._progress: dict[str, Progress | None] = {}
        self._first = True

    def poll(self) -> Change:
        store = self._store
        active = self._active()
        newest = [store.query(each) for each in self._recent]
        recent = [s for each in newest for s in each]
        current = {s.task_id: s for s in recent}
        current.update((s.task_id, s) for s in active)
        for task_id in self._unfinished - current.keys():
            gone = store.get(task_id)  # ended (or pruned) since the last refresh
            if gone is not None:
                current[task_id] = gone
        # Every one of the newest tasks unseen: more may have come and gone unread.
        overflow = not self._first and any(
            len(each) >= RECENT and not any(s.task_id in self._shown for s in each)
            for each in newest
        )
        transitions: list[Transition] = []
        for s in current.values():
            last = self._shown.get(s.task_id)
            if self._first:
                self._shown[s.task_id] = s.status_version
            elif last is None or last < s.status_version:
                read = store.history(s.task_id, since_version=last or 0)
                transitions += read
                # The trail may already hold versions the snapshot read before it did
                # not: they are shown now, so the next refresh starts after them.
                self._shown[s.task_id] = max([s.status_version, *(t.version for t in read)])
        transitions.sort(key=lambda t: (t.at, t.task_id, t.version))
        # Forget what can change no more: a finished task out of the newest few.
        self._shown = {task_id: self._shown[task_id] for task_id in current}
        self._unfinished = {s.task_id for s in current.values() if not s.is_terminal}
        progressed = [s for s in active if self._progress.get(s.task_id) != s.progress]
        self._progress = {s.task_id: s.progress for s in active}
        self._first = False
        return Change(transitions, current, active, progressed, overflow)
