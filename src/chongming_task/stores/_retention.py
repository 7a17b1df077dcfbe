"""Finished tasks by when they ended, for both SQL stores: deleted by age
(``Maintenance``; the rules: docs/design.md, "Retention") and counted per slot of
time (``Maintenance``).

A task is judged by when it ended. The candidates are found through the ``created_at``
index, oldest first, within the tasks created before the cut-off (a task ends after it
is created, so none created since can have ended before it): no index is added for
retention, and a batch reads about as many index entries as it deletes. Each call is
one short write transaction of at most ``limit`` tasks, so that a node's own writes
never wait behind a long delete.

The timeline has no such way in (a task created long ago may have ended a second ago):
it reads the whole table, 0.22-0.32 s on SQLite and 0.09 s on PostgreSQL at a million
tasks, which is why only the dashboard's follower asks, on its own beat. An index on
``ended_at`` would be written by every task's end to spare that."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Protocol

from ..clock import EPOCH
from ..model import TaskSnapshot, TaskStatus
from ..states import TERMINAL
from . import codec
from ._sql import Dialect, Fragment

__all__ = ["RetentionSQL", "check_retention_args", "check_timeline_args", "timeline_of"]


class _Executor(Protocol):
    def execute(self, sql: Any, params: Any = ..., /) -> Any: ...

    def executemany(self, sql: Any, params: Any, /) -> Any: ...


def check_retention_args(
    before: datetime, statuses: frozenset[TaskStatus] | None, limit: int
) -> frozenset[TaskStatus]:
    """The finished statuses to prune (``statuses``, all of them by default); a
    ``ValueError`` for an unfinished one, a naive ``before`` or a ``limit`` below 1."""
    if before.tzinfo is None:
        raise ValueError(f"before must be an aware datetime, got {before.isoformat()}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}")
    chosen = TERMINAL if statuses is None else frozenset(statuses)
    unfinished = sorted(s.value for s in chosen - TERMINAL)
    if unfinished:
        raise ValueError(f"only finished tasks are pruned, not {', '.join(unfinished)}")
    return chosen


def check_timeline_args(since: datetime, width: timedelta) -> int:
    """``width`` in whole microseconds; a ``ValueError`` for a naive ``since`` or a
    ``width`` under a microsecond."""
    if since.tzinfo is None:
        raise ValueError(f"since must be an aware datetime, got {since.isoformat()}")
    micros = width // timedelta(microseconds=1)
    if micros < 1:
        raise ValueError(f"width must be at least a microsecond, got {width}")
    return micros


def timeline_of(
    snapshots: Iterable[TaskSnapshot], since: datetime, width: timedelta
) -> dict[tuple[int, TaskStatus], int]:
    """``ended_timeline`` over snapshots in hand (the memory store; a store without the
    capability, read whole)."""
    step = timedelta(microseconds=check_timeline_args(since, width))
    counts: dict[tuple[int, TaskStatus], int] = {}
    for s in snapshots:
        if s.status in TERMINAL and s.ended_at is not None and s.ended_at >= since:
            key = ((s.ended_at - since) // step, s.status)
            counts[key] = counts.get(key, 0) + 1
    return counts


def ended_where(
    dialect: Dialect,
    before: datetime,
    statuses: frozenset[TaskStatus],
    buckets: frozenset[int] | None,
) -> Fragment:
    """The condition of the finished tasks in ``statuses`` (and ``buckets``) that ended
    before ``before``."""
    at = codec.encode_dt(before)
    # The status index would give every finished task, to be sorted by age (SQLite took
    # 0.29 s a batch at a million tasks): the created_at range is the way in.
    in_status, params = dialect.one_of(
        dialect.unindexed("status"), sorted(s.value for s in statuses)
    )
    where = [f"created_at < {dialect.time}", f"ended_at < {dialect.time}", in_status]
    params = [at, at, *params]
    if buckets is not None:
        in_bucket, more = dialect.one_of("bucket", sorted(buckets))
        where.append(in_bucket)
        params += more
    return " AND ".join(where), params


class RetentionSQL:
    """Mixin: ``prune_ended``, ``count_ended`` and the finished commands' own
    (``Maintenance``: ``prune_finished_commands`` and ``count_finished_commands``,
    through the ``finished_at`` index of both stores), and
    ``ended_timeline`` (``Maintenance``). The store's
    named statements delete a batch: ``prune_ids`` (one statement over an array of
    ids, Postgres) or, per task, ``prune_history`` (id and ``seq``),
    ``prune_commands``, ``prune_late_report`` and ``prune_task`` (SQLite)."""

    __slots__ = ()

    _sql: Mapping[str, str]
    _dialect: Dialect

    def _sql_scope(self, what: str, *, write: bool) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def prune_ended(
        self,
        *,
        before: datetime,
        statuses: frozenset[TaskStatus] | None = None,
        buckets: frozenset[int] | None = None,
        limit: int = 500,
    ) -> int:
        """``Maintenance``."""
        chosen = check_retention_args(before, statuses, limit)
        where, params = ended_where(self._dialect, before, chosen, buckets)
        p = self._dialect.placeholder
        tasks = self._dialect.tasks
        select = (
            f"SELECT task_id, seq, pipeline_run_id FROM {tasks} WHERE {where} "
            f"ORDER BY created_at LIMIT {p}"
        )
        with self._sql_scope("prune by age", write=True) as cur:
            rows = [tuple(r) for r in cur.execute(select, [*params, limit]).fetchall()]
            if rows:
                self._delete_pruned(cur, rows)
        return len(rows)

    def _delete_pruned(self, cur: _Executor, rows: list[tuple[Any, ...]]) -> None:
        """Delete the tasks of ``rows`` (id, seq, pipeline run) with their trail, late
        reports and finished commands, and the pipeline runs whose last task they were
        (under steady retention the pipelines table stays as flat as the tasks)."""
        ids = [row[0] for row in rows]
        runs = sorted({row[2] for row in rows if row[2] is not None})
        if "prune_ids" in self._sql:
            cur.execute(self._sql["prune_ids"], [ids, ids, ids, ids, ids])
            if runs:
                cur.execute(self._sql["prune_pipelines"], [runs])
            return
        cur.executemany(self._sql["prune_history"], [row[:2] for row in rows])
        single = [(task_id,) for task_id in ids]
        for name in ("prune_commands", "prune_late_report", "prune_hold", "prune_task"):
            cur.executemany(self._sql[name], single)
        cur.executemany(self._sql["prune_pipeline"], [(run,) for run in runs])

    def prune_finished_commands(self, *, before: datetime, limit: int = 500) -> int:
        """``Maintenance``."""
        check_retention_args(before, None, limit)
        with self._sql_scope("prune finished commands", write=True) as cur:
            sql = self._sql["prune_finished_commands"]
            return int(cur.execute(sql, [codec.encode_dt(before), limit]).rowcount)

    def count_finished_commands(self, *, before: datetime) -> int:
        """``Maintenance``."""
        check_retention_args(before, None, 1)
        with self._sql_scope("count finished commands", write=False) as cur:
            sql = self._sql["count_finished_commands"]
            return int(cur.execute(sql, [codec.encode_dt(before)]).fetchone()[0])

    def count_ended(
        self,
        *,
        before: datetime,
        statuses: frozenset[TaskStatus] | None = None,
        buckets: frozenset[int] | None = None,
    ) -> int:
        """``Maintenance``."""
        chosen = check_retention_args(before, statuses, 1)
        where, params = ended_where(self._dialect, before, chosen, buckets)
        with self._sql_scope("count by age", write=False) as cur:
            return int(
                cur.execute(
                    f"SELECT COUNT(*) FROM {self._dialect.tasks} WHERE {where}", params
                ).fetchone()[0]
            )

    def ended_timeline(
        self, *, since: datetime, width: timedelta
    ) -> dict[tuple[int, TaskStatus], int]:
        """``Maintenance``."""
        step = check_timeline_args(since, width)
        d = self._dialect
        p = d.placeholder
        in_status, statuses = d.one_of(d.unindexed("status"), sorted(s.value for s in TERMINAL))
        # Both times in whole microseconds: the slot is an exact integer division.
        sql = (
            f"SELECT ({d.micros('ended_at')} - {p}) / {p} AS slot, status, COUNT(*)"
            f" FROM {d.tasks} WHERE ended_at >= {d.time} AND {in_status} GROUP BY slot, status"
        )
        since_micros = (since - EPOCH) // timedelta(microseconds=1)
        params = [since_micros, step, codec.encode_dt(since), *statuses]
        with self._sql_scope("ended timeline", write=False) as cur:
            rows = cur.execute(sql, params).fetchall()
        return {(int(slot), TaskStatus(status)): int(n) for slot, status, n in rows}
