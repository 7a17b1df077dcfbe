"""Holds (``CommandChannel``) written once for both SQL stores: the tasks a pause holds
before they started (waiting to retry, delayed, or queued), kept beside the task so that
every process can find them (docs/design.md, "A pause before the start")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime

from . import codec
from ._sql import Executor, json_id_list

__all__ = ["HoldsSQL"]


class HoldsSQL:
    """Mixin: a store gives ``_sql`` (statements ``hold_task``, ``release_hold``,
    ``holds``, ``holds_of``) and ``_sql_scope``."""

    __slots__ = ()

    _sql: Mapping[str, str]

    def _sql_scope(self, what: str, *, write: bool) -> AbstractContextManager[Executor]:
        raise NotImplementedError

    _id_list = staticmethod(json_id_list)

    def hold_task(self, task_id: str, *, since: datetime, by: str) -> None:
        """``CommandChannel``."""
        with self._sql_scope("hold_task", write=True) as cur:
            cur.execute(self._sql["hold_task"], (task_id, codec.encode_dt(since), by))

    def release_hold(self, task_id: str) -> None:
        """``CommandChannel``."""
        with self._sql_scope("release_hold", write=True) as cur:
            cur.execute(self._sql["release_hold"], (task_id,))

    def holds(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 1000
    ) -> dict[str, datetime]:
        """``CommandChannel``."""
        with self._sql_scope("holds", write=False) as cur:
            if task_ids is None:
                rows = cur.execute(self._sql["holds"], (limit,)).fetchall()
            elif not task_ids:
                return {}
            else:
                rows = cur.execute(self._sql["holds_of"], (self._id_list(task_ids),)).fetchall()
        found = {str(task_id): codec.decode_dt(since) for task_id, since in rows}
        return {t: at for t, at in found.items() if at is not None}
