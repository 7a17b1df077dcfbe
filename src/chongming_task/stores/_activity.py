"""Lease renewals and activity (progress, heartbeats) written once for both SQL stores:
never on a finished row, never on a row another node holds, and each call says which
tasks it wrote, so a node learns at once that the store has moved on without it
(docs/design.md, "Leases are not heartbeats")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from ..model import Progress, utc
from . import codec
from ._sql import Executor

__all__ = ["Activity", "ActivitySQL"]

Activity = tuple[str, Progress | None, datetime | None]
"""One task's activity to write: its id, progress and heartbeat (``None``: as is)."""


class ActivitySQL:
    """Mixin: ``renew_leases`` and ``write_activity`` through a store's ``_sql``
    (statements ``renew_lease`` and ``write_activity``, one task each, ``RETURNING`` its
    id when written) and ``_sql_scope``; ``_each_returning`` runs one statement for many
    rows (one at a time here; a store with pipelining overrides it)."""

    __slots__ = ()

    _sql: Mapping[str, str]

    def _sql_scope(self, what: str, *, write: bool) -> AbstractContextManager[Executor]:
        raise NotImplementedError

    def _each_returning(self, cur: Executor, sql: str, rows: list[list[Any]]) -> list[str]:
        """Run ``sql`` once for each of ``rows``; the first column of what they return."""
        written: list[str] = []
        for row in rows:
            written.extend(r[0] for r in cur.execute(sql, row).fetchall())
        return written

    def renew_leases(self, task_ids: Sequence[str], *, owner: str, until: datetime) -> list[str]:
        """``BatchedWrites``."""
        if not task_ids:
            return []
        ends = codec.encode_dt(utc(until, "until"))
        rows = [[owner, ends, task_id, owner] for task_id in task_ids]
        with self._sql_scope("renew_leases", write=True) as cur:
            return self._each_returning(cur, self._sql["renew_lease"], rows)

    def write_activity(self, items: Sequence[Activity], *, owner: str) -> list[str]:
        """``BatchedWrites``."""
        if not items:
            return []
        rows = [
            [codec.encode_progress(progress), codec.encode_dt(heartbeat), task_id, owner]
            for task_id, progress, heartbeat in items
        ]
        with self._sql_scope("write_activity", write=True) as cur:
            return self._each_returning(cur, self._sql["write_activity"], rows)
