"""Dedupe keys enforced by the store, written once for both SQL stores (docs/design.md,
"When and in what order"): in one transaction, find who holds the key (one probe of the
dedupe index), and create the task only if nobody does. SQLite's write transaction
already excludes every other writer; Postgres takes a transaction lock on the key first
(``dedupe_lock``), so two transactions racing with one key run one after the other and
the second finds the first's task."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..model import TaskSnapshot, TaskStatus, Transition, utc
from . import codec
from ._sql import Executor

__all__ = ["DedupeSQL", "holder"]


def holder(rows: Iterable[Sequence[Any]], now: datetime) -> str | None:
    """The task holding a key, from its candidates (task id, status, ended at, dedupe
    window): an unfinished one, or a success less than its window before ``now``."""
    for task_id, status, ended_at, window in rows:
        if not TaskStatus(status).is_terminal:
            return str(task_id)
        ended = codec.decode_dt(ended_at)
        if status != "succeeded" or window is None or ended is None:
            continue
        if ended + timedelta(seconds=float(window)) > now:  # kept after its success
            return str(task_id)
    return None


class DedupeSQL:
    """Mixin: ``create_deduped`` (``SupportsDedupe``) through a store's ``_sql``
    (``dedupe_holders``; ``dedupe_lock`` where the store needs one), ``atomic``,
    ``create`` and ``append``."""

    __slots__ = ()

    _sql: Mapping[str, str]

    def _sql_scope(self, what: str, *, write: bool) -> AbstractContextManager[Executor]:
        raise NotImplementedError

    if TYPE_CHECKING:  # the store's own

        def atomic(self) -> AbstractContextManager[None]: ...
        def create(self, snapshot: TaskSnapshot) -> None: ...
        def append(self, transition: Transition) -> None: ...

    def create_deduped(
        self, snapshot: TaskSnapshot, created: Transition, *, now: datetime
    ) -> str | None:
        """Optional capability (``SupportsDedupe``)."""
        key = snapshot.dedupe_key
        if key is None:
            raise ValueError(f"task {snapshot.task_id} has no dedupe_key")
        now = utc(now, "now")
        with self.atomic():
            with self._sql_scope("create_deduped", write=True) as cur:
                lock = self._sql.get("dedupe_lock")
                if lock is not None:
                    cur.execute(lock, [key])
                found = holder(cur.execute(self._sql["dedupe_holders"], [key]).fetchall(), now)
            if found is not None:
                return found
            self.create(snapshot)
            self.append(created)
        return None
