"""``SqlStore``: what the SQLite and PostgreSQL stores share, written once. Each store
hands it its named statements (``queries.sql``), its ``Dialect`` and its transaction
scope; ``SqlStore`` runs, through them, everything that is the same SQL in both: the
core's reads, the command queue and its claims, leases and activity, dedupe keys, holds,
the fleet registry, retention, late reports and the questions about many tasks.

What each store writes its own way stays in it: the hot writes (``create``,
``create_many``, ``write_transitions`` and its together and behind forms, each through
the store's group commit), ``save``, ``append``, ``touch`` and ``prune``, the
compare-and-sets of reconcile, and the wake-ups.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from ..clock import EPOCH
from ..errors import StoreError, TaskAlreadyExists, UnreadableRow
from ..health import NodeHealth
from ..late import LateReport
from ..model import (
    Command,
    NodeRecord,
    PipelineRecord,
    Progress,
    ScheduleRecord,
    TaskQuery,
    TaskScan,
    TaskSnapshot,
    TaskStatus,
    Transition,
    utc,
)
from ..states import TERMINAL
from . import codec
from .roles import (
    PREVIEW,
    CountBy,
    Previewed,
    check_retention_args,
    check_timeline_args,
    dedupe_holder,
    in_arrival_order,
)
from .sql import Dialect, Executor, count_sql, ended_where, query_sql, scan_sql

__all__ = ["DEDUPE_HELD", "UNFINISHED_KEYS", "KeyHeld", "Scope", "SqlStore"]

log = logging.getLogger("chongming_task.store")

Scope = Callable[..., AbstractContextManager[Executor]]
"""``scope(what, write=...)``: one transaction of the store (``write``: one that writes),
its statements run through what it gives; ``what`` names the call in an error."""

DEDUPE_HELD = "chongming-task: dedupe key held"
"""What SQLite's write view raises for a new task whose dedupe key is held."""
UNFINISHED_KEYS = "idx_tasks_dedupe_open"
"""Postgres's unique index on the dedupe keys of unfinished tasks."""

_SCAN = 1000
"""Open commands a claim reads at most (in arrival order): the rule needs only the
commands before the ones it hands out, so a cut never breaks it."""


class KeyHeld(TaskAlreadyExists):
    """A create refused in the store: its dedupe key is held (the caller finds by whom)."""


class SqlStore(ABC):
    """The roles' shared SQL over one store's statements, dialect and scope.

    Statements it runs, by name: the command queue's (``open_commands``,
    ``open_commands_for``, ``lease_command``, ``complete_command``, ``release_command``,
    ``pending_commands``, ``finished_commands``; ``lock_commands`` where claimers run side
    by side), ``renew_lease`` and ``write_activity``, ``dedupe_holders``, the holds', the
    late reports', the registry's (nodes, schedules, pipelines), and retention's
    (``prune_ids`` for a store that deletes a batch in one statement, else one statement
    per table and task)."""

    def __init__(self, *, statements: Mapping[str, str], dialect: Dialect, scope: Scope) -> None:
        self._sql = statements
        self._dialect = dialect
        self._scope = scope

    @abstractmethod
    def create_many(self, items: Sequence[tuple[TaskSnapshot, Transition]]) -> None:
        """Each store's own (its group commit); ``create_deduped`` creates through it."""

    # -- the core's reads -------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskSnapshot | None:
        if not self._dialect.nul_in_text and "\x00" in task_id:
            return None  # no stored text holds NUL: nothing has that id
        with self._scope("get", write=False) as c:
            row = c.execute(self._sql["get_task"], (task_id,)).fetchone()
        return None if row is None else codec.values_to_snapshot(row)

    def get_previewed(self, task_id: str) -> Previewed | None:
        """``get``, a result longer than ``PREVIEW`` characters of JSON text left out
        and its preview given (``SupportsResultPreview``): the statement reads the
        preview column each store writes beside the result, never the result itself."""
        if not self._dialect.nul_in_text and "\x00" in task_id:
            return None
        with self._scope("get", write=False) as c:
            row = c.execute(self._sql["get_previewed"], (task_id,)).fetchone()
        if row is None:
            return None
        *values, preview = row
        snapshot = codec.values_to_snapshot(values)
        return Previewed(snapshot, None if preview is None else preview[:PREVIEW])

    def result_json(self, task_id: str) -> str | None:
        """The result's JSON text as stored, never decoded (``SupportsResultPreview``)."""
        if not self._dialect.nul_in_text and "\x00" in task_id:
            return None
        with self._scope("get", write=False) as c:
            row = c.execute(self._sql["result_json"], (task_id,)).fetchone()
        return None if row is None else row[0]

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        query = query or TaskQuery()
        if not self._dialect.nul_in_text and any("\x00" in text for _, text in query.texts()):
            return []  # no stored text holds NUL: nothing matches
        sql, params = query_sql(query, self._dialect)
        with self._scope("query", write=False) as c:
            rows = c.execute(sql, params).fetchall()
        return _readable(rows)

    def counts(self) -> dict[TaskStatus, int]:
        with self._scope("counts", write=False) as c:
            rows = c.execute(self._sql["counts"]).fetchall()
        found: dict[TaskStatus, int] = {}
        for status, n in rows:
            try:
                found[TaskStatus(status)] = n
            except ValueError:
                codec.say_once(
                    log, f"{n} task(s) in a status this release does not know: {status!r}"
                )
        return found

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        with self._scope("history", write=False) as c:
            rows = c.execute(self._sql["history"], (task_id, since_version)).fetchall()
        return [codec.values_to_transition(r) for r in rows]

    # -- BatchedWrites: leases, activity, dedupe keys -------------------------------------------

    def renew_leases(self, task_ids: Sequence[str], *, owner: str, until: datetime) -> list[str]:
        if not task_ids:
            return []
        ends = codec.encode_dt(utc(until, "until"))
        rows = [[owner, ends, task_id, owner] for task_id in task_ids]
        with self._scope("renew_leases", write=True) as cur:
            return self._dialect.each_returning(cur, self._sql["renew_lease"], rows)

    def write_activity(
        self, items: Sequence[tuple[str, Progress | None, datetime | None]], *, owner: str
    ) -> list[str]:
        if not items:
            return []
        rows = [
            [codec.encode_progress(progress), codec.encode_dt(heartbeat), task_id, owner]
            for task_id, progress, heartbeat in items
        ]
        with self._scope("write_activity", write=True) as cur:
            return self._dialect.each_returning(cur, self._sql["write_activity"], rows)

    def create_deduped(self, snapshot: TaskSnapshot, created: Transition) -> str | None:
        """Through the store's own ``create_many``, which refuses a new task whose key an
        unfinished task holds, inside its group commit (SQLite: the write view's trigger,
        under the write lock; Postgres: a unique index on the keys of unfinished tasks,
        and the insert's own check of the successes that keep theirs), so a deduplicated
        create rides the group commit like any other; only a refused one reads the
        holder (one probe of the dedupe index)."""
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
            with self._scope("dedupe holder", write=False) as cur:
                rows = cur.execute(self._sql["dedupe_holders"], [key]).fetchall()
            if (found := dedupe_holder(rows, now)) is not None:
                return found
        raise StoreError(f"dedupe key {key!r}: refused as held, yet no holder was found")

    # -- the core's command queue, and CommandChannel's claims and holds ------------------------

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        return self._claim(None, now=now, lease_seconds=lease_seconds, limit=limit)

    def claim_commands_for(
        self, holder: str, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        return self._claim(holder, now=now, lease_seconds=lease_seconds, limit=limit)

    def _claim(
        self, holder: str | None, *, now: datetime, lease_seconds: float, limit: int
    ) -> list[Command]:
        """Commands handed out in the order the store received them, one task's never
        out of that order (docs/design.md, "Commands")."""
        now = utc(now, "now")
        at = codec.encode_dt(now)
        until = codec.encode_dt(now + timedelta(seconds=lease_seconds))
        sql = self._sql
        with self._scope("claim_commands", write=True) as cur:
            if holder is None:
                rows = cur.execute(sql["open_commands"], (at, _SCAN)).fetchall()
            else:
                rows = cur.execute(sql["open_commands_for"], (at, holder, _SCAN)).fetchall()
            chosen = in_arrival_order([(r[1], r[2], bool(r[0])) for r in rows], limit=limit)
            if not chosen:
                return []
            # Where claimers run side by side, lock the commands picked, skipping those
            # another claimer is taking; elsewhere the write transaction excludes them.
            held = (
                {row[0] for row in cur.execute(sql["lock_commands"], [chosen, at]).fetchall()}
                if "lock_commands" in sql
                else set(chosen)
            )
            wanted = set(chosen)
            marks = [(r[1], r[2], r[1] not in held) for r in rows if r[1] in wanted]
            picked = in_arrival_order(marks, limit=limit)
            cur.executemany(sql["lease_command"], [(until, cid) for cid in picked])
        by_id = {r[1]: r for r in rows}
        return [
            codec.values_to_command((*by_id[cid][1:7], until, *by_id[cid][8:])) for cid in picked
        ]

    def pending_commands(self, task_id: str) -> list[Command]:
        with self._scope("pending_commands", write=False) as cur:
            rows = cur.execute(self._sql["pending_commands"], (task_id,)).fetchall()
        return [codec.values_to_command(r) for r in rows]

    def finished_commands(self, *, after: datetime, limit: int = 500) -> list[Command]:
        with self._scope("finished_commands", write=False) as cur:
            rows = cur.execute(
                self._sql["finished_commands"], (codec.encode_dt(utc(after, "after")), limit)
            ).fetchall()
        return [codec.values_to_command(r) for r in rows]

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        with self._scope("complete_command", write=True) as cur:
            cur.execute(self._sql["complete_command"], (codec.encode_dt(now), outcome, command_id))

    def release_command(self, command_id: str, *, now: datetime) -> None:
        with self._scope("release_command", write=True) as cur:
            cur.execute(self._sql["release_command"], (command_id,))

    def hold_task(self, task_id: str, *, since: datetime, by: str) -> None:
        with self._scope("hold_task", write=True) as cur:
            cur.execute(self._sql["hold_task"], (task_id, codec.encode_dt(since), by))

    def release_hold(self, task_id: str) -> None:
        with self._scope("release_hold", write=True) as cur:
            cur.execute(self._sql["release_hold"], (task_id,))

    def holds(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 1000
    ) -> dict[str, datetime]:
        with self._scope("holds", write=False) as cur:
            if task_ids is None:
                rows = cur.execute(self._sql["holds"], (limit,)).fetchall()
            elif not task_ids:
                return {}
            else:
                ids = self._dialect.id_list(task_ids)
                rows = cur.execute(self._sql["holds_of"], (ids,)).fetchall()
        found = {str(task_id): codec.decode_dt(since) for task_id, since in rows}
        return {t: at for t, at in found.items() if at is not None}

    # -- FleetRegistry ----------------------------------------------------------------------------

    def _seen(self, given: datetime) -> str | None:
        """The node time to write (``None``: the statements read the store's clock)."""
        return None if self._dialect.clock_in_sql else codec.encode_dt(given)

    def declare_node(self, record: NodeRecord) -> None:
        seen = self._seen(record.seen_at)
        with self._scope("declare_node", write=True) as c:
            c.execute(
                self._sql["upsert_node"],
                [
                    record.node,
                    record.num_buckets,
                    record.buckets is None,
                    record.ttl_seconds,
                    seen,
                    seen,
                    record.host,
                    record.pid,
                    None if record.health is None else record.health.to_json(),
                ],
            )
            c.execute(self._sql["forget_node_buckets"], [record.node])
            if record.buckets:
                c.executemany(
                    self._sql["declare_node_bucket"],
                    [[b, record.node, seen] for b in sorted(record.buckets)],
                )

    def refresh_node(self, node: str, *, now: datetime, health: NodeHealth | None = None) -> bool:
        # One statement: the declared buckets' rows keep the time they were declared.
        said = None if health is None else health.to_json()
        with self._scope("refresh_node", write=True) as c:
            return bool(
                c.execute(self._sql["refresh_node"], [self._seen(now), said, node]).rowcount
            )

    def pulse_node(
        self, node: str, *, now: datetime, health: NodeHealth | None = None
    ) -> int | None:
        said = None if health is None else health.to_json()
        with self._scope("pulse_node", write=True) as c:
            row = c.execute(self._sql["pulse_node"], [self._seen(now), said, node]).fetchone()
        return None if row is None else int(row[0])

    def retire_node(self, node: str, *, now: datetime) -> None:
        with self._scope("retire_node", write=True) as c:
            c.execute(self._sql["retire_node"], [self._seen(now), node])

    def nodes(self) -> list[NodeRecord]:
        with self._scope("nodes", write=False) as c:
            rows = c.execute(self._sql["nodes"]).fetchall()
        return [
            NodeRecord(
                node=node,
                buckets=None
                if every
                else frozenset(int(b) for b in (buckets or "").split(",") if b),
                num_buckets=num,
                ttl_seconds=float(ttl),
                started_at=codec.decode_dt(started),  # type: ignore[arg-type]
                seen_at=codec.decode_dt(seen),  # type: ignore[arg-type]
                stopped_at=codec.decode_dt(stopped),
                host=host,
                pid=pid,
                health=NodeHealth.from_json(health),
            )
            for node, num, every, ttl, started, seen, stopped, host, pid, health, buckets in rows
        ]

    def declare_schedule(self, record: ScheduleRecord) -> None:
        # Times as the node gives them: they are its own plans, for people to read.
        dt = codec.encode_dt
        with self._scope("declare_schedule", write=True) as c:
            c.execute(
                self._sql["upsert_schedule"],
                [
                    record.node,
                    record.name,
                    record.task,
                    record.trigger,
                    dt(record.next_fire_at),
                    dt(record.last_fired_at),
                    record.last_task_id,
                    record.fired,
                    record.skipped,
                    dt(record.updated_at),
                ],
            )

    def forget_schedule(self, node: str, name: str) -> None:
        with self._scope("forget_schedule", write=True) as c:
            c.execute(self._sql["forget_schedule"], [node, name])

    def schedules(self) -> list[ScheduleRecord]:
        with self._scope("schedules", write=False) as c:
            rows = c.execute(self._sql["schedules"]).fetchall()
        dt = codec.decode_dt
        return [
            ScheduleRecord(
                node=row[0],
                name=row[1],
                task=row[2],
                trigger=row[3],
                next_fire_at=dt(row[4]),
                last_fired_at=dt(row[5]),
                last_task_id=row[6],
                fired=row[7],
                skipped=row[8],
                updated_at=dt(row[9]),  # type: ignore[arg-type]
            )
            for row in rows
        ]

    def record_pipeline(self, record: PipelineRecord) -> None:
        shape = json.dumps(  # the run's shape in one JSON column
            {
                key: [task_id, list(record.depends_on.get(key, ()))]
                for key, task_id in record.tasks.items()
            },
            ensure_ascii=False,
        )
        with self._scope("record_pipeline", write=True) as c:
            c.execute(
                self._sql["upsert_pipeline"],
                [
                    record.pipeline_run_id,
                    record.name,
                    record.node,
                    codec.encode_dt(record.created_at),
                    shape,
                ],
            )

    def pipeline_record(self, pipeline_run_id: str) -> PipelineRecord | None:
        with self._scope("pipeline_record", write=False) as c:
            row = c.execute(self._sql["pipeline"], [pipeline_run_id]).fetchone()
        return None if row is None else _pipeline(row)

    def pipeline_records(self, *, limit: int = 50) -> list[PipelineRecord]:
        with self._scope("pipeline_records", write=False) as c:
            rows = c.execute(self._sql["pipelines"], [limit]).fetchall()
        return [_pipeline(row) for row in rows]

    # -- Maintenance ------------------------------------------------------------------------------

    def count_tasks(
        self, by: CountBy, *, statuses: frozenset[TaskStatus] | None = None
    ) -> dict[Any, int]:
        sql, params = count_sql(by, statuses, self._dialect)
        with self._scope("count_tasks", write=False) as c:
            rows = c.execute(sql, params).fetchall()
        if by == "status":
            return {TaskStatus(value): n for value, n in rows}
        if by == "bucket_status":
            return {(bucket, TaskStatus(status)): n for bucket, status, n in rows}
        return {value: n for value, n in rows}

    def scan_tasks(self, scan: TaskScan) -> tuple[int, list[TaskSnapshot]]:
        (count_q, count_p), (rows_q, rows_p) = scan_sql(scan, self._dialect)
        with self._scope("scan_tasks", write=False) as c:
            (count,) = c.execute(count_q, count_p).fetchone()
            rows = [] if not count or scan.limit == 0 else c.execute(rows_q, rows_p).fetchall()
        return count, _readable(rows)

    # Retention (docs/design.md, "Retention"). A task is judged by when it ended. The
    # candidates are found through the created_at index, oldest first, within the tasks
    # created before the cut-off (a task ends after it is created): no index is added for
    # retention, and a batch reads about as many index entries as it deletes. Each call
    # is one short write transaction of at most ``limit`` tasks, so that a node's own
    # writes never wait behind a long delete.

    def prune_ended(
        self,
        *,
        before: datetime,
        statuses: frozenset[TaskStatus] | None = None,
        buckets: frozenset[int] | None = None,
        limit: int = 500,
    ) -> int:
        chosen = check_retention_args(before, statuses, limit)
        where, params = ended_where(self._dialect, before, chosen, buckets)
        p = self._dialect.placeholder
        select = (
            f"SELECT task_id, seq, pipeline_run_id FROM {self._dialect.tasks} WHERE {where} "
            f"ORDER BY created_at LIMIT {p}"
        )
        with self._scope("prune by age", write=True) as cur:
            rows = [tuple(r) for r in cur.execute(select, [*params, limit]).fetchall()]
            if rows:
                self._delete_pruned(cur, rows)
        return len(rows)

    def _delete_pruned(self, cur: Executor, rows: list[tuple[Any, ...]]) -> None:
        """Delete the tasks of ``rows`` (id, seq, pipeline run) with their trail, late
        reports, holds and finished commands, and the pipeline runs whose last task they
        were (under steady retention the pipelines table stays as flat as the tasks)."""
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

    def count_ended(
        self,
        *,
        before: datetime,
        statuses: frozenset[TaskStatus] | None = None,
        buckets: frozenset[int] | None = None,
    ) -> int:
        chosen = check_retention_args(before, statuses, 1)
        where, params = ended_where(self._dialect, before, chosen, buckets)
        with self._scope("count by age", write=False) as cur:
            sql = f"SELECT COUNT(*) FROM {self._dialect.tasks} WHERE {where}"
            return int(cur.execute(sql, params).fetchone()[0])

    def prune_finished_commands(self, *, before: datetime, limit: int = 500) -> int:
        check_retention_args(before, None, limit)  # through the finished_at index
        with self._scope("prune finished commands", write=True) as cur:
            sql = self._sql["prune_finished_commands"]
            return int(cur.execute(sql, [codec.encode_dt(before), limit]).rowcount)

    def count_finished_commands(self, *, before: datetime) -> int:
        check_retention_args(before, None, 1)
        with self._scope("count finished commands", write=False) as cur:
            sql = self._sql["count_finished_commands"]
            return int(cur.execute(sql, [codec.encode_dt(before)]).fetchone()[0])

    def ended_timeline(
        self, *, since: datetime, width: timedelta
    ) -> dict[tuple[int, TaskStatus], int]:
        """Unlike retention, the timeline has no way in through an index (a task created
        long ago may have ended a second ago): it reads the whole table, 0.22-0.32 s on
        SQLite and 0.09 s on PostgreSQL at a million tasks, which is why only the
        dashboard's follower asks, on its own beat. An index on ``ended_at`` would be
        written by every task's end to spare that."""
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
        with self._scope("ended timeline", write=False) as cur:
            rows = cur.execute(sql, params).fetchall()
        return {(int(slot), TaskStatus(status)): int(n) for slot, status, n in rows}

    def record_late_report(self, report: LateReport) -> None:
        values = codec.late_report_to_values(report)
        with self._scope("record_late_report", write=True) as cur:
            cur.execute(self._sql["record_late_report"], values)

    def late_reports(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 100
    ) -> list[LateReport]:
        with self._scope("late_reports", write=False) as cur:
            if task_ids is None:
                rows = cur.execute(self._sql["late_reports"], (limit,)).fetchall()
            elif not task_ids:
                return []
            else:
                ids = self._dialect.id_list(task_ids)
                rows = cur.execute(self._sql["late_reports_of"], (ids,)).fetchall()
        return [codec.values_to_late_report(r) for r in rows][:limit]

    def count_late_reports(self) -> int:
        with self._scope("count_late_reports", write=False) as cur:
            (count,) = cur.execute(self._sql["count_late_reports"]).fetchone()
        return int(count)


def _held_in_index(exc: BaseException) -> bool:
    """A unique violation of the index on unfinished tasks' dedupe keys (Postgres)."""
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    return getattr(diag, "constraint_name", None) == UNFINISHED_KEYS


def _pipeline(row: Sequence[Any]) -> PipelineRecord:
    shape: dict[str, list[Any]] = json.loads(row[4])
    return PipelineRecord(
        pipeline_run_id=row[0],
        name=row[1],
        node=row[2],
        created_at=codec.decode_dt(row[3]),  # type: ignore[arg-type]
        tasks={key: task_id for key, (task_id, _) in shape.items()},
        depends_on={key: tuple(deps) for key, (_, deps) in shape.items()},
    )


def _readable(rows: Sequence[Sequence[Any]]) -> list[TaskSnapshot]:
    """Rows as snapshots; a row that cannot be read is left out, each said in one line
    (a list shows the rest of the store; ``get`` of that task raises ``UnreadableRow``)."""
    found: list[TaskSnapshot] = []
    for row in rows:
        try:
            found.append(codec.values_to_snapshot(row))
        except UnreadableRow as exc:
            codec.leave_out(exc, log)
    return found
