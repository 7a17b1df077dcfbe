"""Dedupe keys enforced by the store, written once for both SQL stores (docs/design.md,
"When and in what order"): the store's create refuses a new task whose key is held, and
only then is the holder looked up (one probe of the dedupe index)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..errors import StoreError, TaskAlreadyExists
from ..model import TaskSnapshot, TaskStatus, Transition
from . import codec
from ._sql import Executor

__all__ = ["DEDUPE_HELD", "UNFINISHED_KEYS", "DedupeSQL", "KeyHeld", "holder"]

DEDUPE_HELD = "chongming-task: dedupe key held"
"""What SQLite's write view raises for a new task whose dedupe key is held."""
UNFINISHED_KEYS = "idx_tasks_dedupe_open"
"""Postgres's unique index on the dedupe keys of unfinished tasks."""


_SLACK = timedelta(milliseconds=5)


class KeyHeld(TaskAlreadyExists):
    """A create refused in the store: its dedupe key is held (the caller finds by whom)."""


def holder(rows: Iterable[Sequence[Any]], now: datetime) -> str | None:
    """The task holding a key, from its candidates (task id, status, ended at, dedupe
    window): an unfinished one, or a success less than its window before ``now``."""
    for task_id, status, ended_at, window in rows:
        if not TaskStatus(status).is_terminal:
            return str(task_id)
        ended = codec.decode_dt(ended_at)
        if status != "succeeded" or window is None or ended is None:
            continue
        # Kept after its success. The store judged the window in SQL (SQLite's julianday
        # is good to about a millisecond): near its end, the success still answers.
        if ended + timedelta(seconds=float(window)) + _SLACK > now:
            return str(task_id)
    return None


class DedupeSQL:
    """Mixin: ``create_deduped`` (``BatchedWrites``) through the store's own
    ``create_many``, which refuses a new task whose key an unfinished task holds, inside
    its group commit (SQLite: the write view's trigger, under the write lock; Postgres:
    a unique index on the keys of unfinished tasks, and the insert's own check of the
    successes that keep theirs), so a deduplicated create rides the group commit like
    any other; ``dedupe_holders`` finds the holder for a duplicate."""

    __slots__ = ()

    _sql: Mapping[str, str]

    def _sql_scope(self, what: str, *, write: bool) -> AbstractContextManager[Executor]:
        raise NotImplementedError

    if TYPE_CHECKING:  # the store's own

        def create_many(self, items: Sequence[tuple[TaskSnapshot, Transition]]) -> None: ...

    def create_deduped(self, snapshot: TaskSnapshot, created: Transition) -> str | None:
        """``BatchedWrites``."""
        key = snapshot.dedupe_key
        if key is None:
            raise ValueError(f"task {snapshot.task_id} has no dedupe_key")
        now = snapshot.created_at
        for _ in range(3):  # a holder that ends between the refusal and the read: again
            try:
                self.create_many([(snapshot, created)])
            except TaskAlreadyExists:  # KeyHeld; or not inserted: a success keeps the key
                pass
            except StoreError as exc:
                if not _held_in_index(exc):
                    raise
            else:
                return None
            if (found := self._holder(key, now)) is not None:
                return found
        raise StoreError(f"dedupe key {key!r}: refused as held, yet no holder was found")

    def _holder(self, key: str, now: datetime) -> str | None:
        with self._sql_scope("dedupe holder", write=False) as cur:
            return holder(cur.execute(self._sql["dedupe_holders"], [key]).fetchall(), now)


def _held_in_index(exc: BaseException) -> bool:
    """A unique violation of the index on unfinished tasks' dedupe keys (Postgres)."""
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    return getattr(diag, "constraint_name", None) == UNFINISHED_KEYS
