"""The questions about many tasks (``SupportsTaskScan``, ``SupportsEndedTimeline``)
answered for a store that cannot answer them itself: by reading the tasks through the
14 methods of ``TaskStore``. Time and memory grow with the store; ``Capabilities`` uses
this only where the store declares neither."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..model import TaskQuery, TaskScan, TaskSnapshot, TaskStatus
from ..states import TERMINAL
from ._retention import timeline_of
from .protocol import TaskStore

__all__ = ["ReadWhole"]


class ReadWhole:
    """``count_tasks``, ``scan_tasks`` and ``ended_timeline`` over ``store.query``."""

    __slots__ = ("store",)

    def __init__(self, store: TaskStore) -> None:
        self.store = store

    def count_tasks(
        self, by: str, *, statuses: frozenset[TaskStatus] | None = None
    ) -> dict[Any, int]:
        counts: dict[Any, int] = {}
        for s in self.store.query(TaskQuery(statuses=statuses)):
            value = (s.bucket, s.status) if by == "bucket_status" else getattr(s, by)
            counts[value] = counts.get(value, 0) + 1
        return counts

    def scan_tasks(self, scan: TaskScan) -> tuple[int, list[TaskSnapshot]]:
        store = self.store
        kept = [
            s
            for s in store.query(TaskQuery(statuses=scan.statuses, buckets=scan.buckets))
            if scan.matches(s)
        ]
        if scan.unchanged_since is not None:
            cut = scan.unchanged_since
            kept = [s for s in kept if s.created_at <= cut and self._changed_at(s) <= cut]
        return len(kept), kept if scan.limit is None else kept[: scan.limit]

    def ended_timeline(
        self, *, since: datetime, width: timedelta
    ) -> dict[tuple[int, TaskStatus], int]:
        return timeline_of(self.store.query(TaskQuery(statuses=TERMINAL)), since, width)

    def _changed_at(self, s: TaskSnapshot) -> datetime:
        """When the task last changed status: its trail's row for the current version."""
        trail = self.store.history(s.task_id, since_version=s.status_version - 1)
        return trail[-1].at if trail else s.created_at
