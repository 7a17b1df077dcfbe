"""The node and schedule registries (``FleetRegistry``) written once for both SQL stores:
the same named statements (in each store's ``queries.sql``) through each store's own
transaction scope. Node times are taken from the store's clock where it has one: its
statements read it themselves (no round trip of its own)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from ..health import NodeHealth
from ..model import NodeRecord, PipelineRecord, ScheduleRecord
from . import codec
from ._sql import Executor

__all__ = ["NodeRegistrySQL", "PipelineRegistrySQL", "ScheduleRegistrySQL"]


class NodeRegistrySQL:
    """Mixin: a store gives ``_sql`` (its named statements), ``_sql_scope(what, write=)``
    (one transaction) and, if it has a clock, ``_seen`` giving ``None``: its statements
    then write the clock's time for a time not given."""

    __slots__ = ()

    _sql: Mapping[str, str]

    def _sql_scope(self, what: str, *, write: bool) -> AbstractContextManager[Executor]:
        raise NotImplementedError

    def _seen(self, given: datetime) -> str | None:
        """The node time to write (``None``: the store's statements read its clock)."""
        return codec.encode_dt(given)

    def declare_node(self, record: NodeRecord) -> None:
        seen = self._seen(record.seen_at)
        with self._sql_scope("declare_node", write=True) as c:
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
        with self._sql_scope("refresh_node", write=True) as c:
            return bool(
                c.execute(self._sql["refresh_node"], [self._seen(now), said, node]).rowcount
            )

    def pulse_node(
        self, node: str, *, now: datetime, health: NodeHealth | None = None
    ) -> int | None:
        """``FleetRegistry``."""
        said = None if health is None else health.to_json()
        with self._sql_scope("pulse_node", write=True) as c:
            row = c.execute(self._sql["pulse_node"], [self._seen(now), said, node]).fetchone()
        return None if row is None else int(row[0])

    def retire_node(self, node: str, *, now: datetime) -> None:
        with self._sql_scope("retire_node", write=True) as c:
            c.execute(self._sql["retire_node"], [self._seen(now), node])

    def nodes(self) -> list[NodeRecord]:
        with self._sql_scope("nodes", write=False) as c:
            rows = c.execute(self._sql["nodes"]).fetchall()
            pairs = c.execute(self._sql["node_buckets"]).fetchall()
        declared: dict[str, set[int]] = {}
        for node, bucket in pairs:
            declared.setdefault(node, set()).add(bucket)
        out = []
        for node, num, every, ttl, started, seen, stopped, host, pid, health in rows:
            out.append(
                NodeRecord(
                    node=node,
                    buckets=None if every else frozenset(declared.get(node, ())),
                    num_buckets=num,
                    ttl_seconds=float(ttl),
                    started_at=codec.decode_dt(started),  # type: ignore[arg-type]
                    seen_at=codec.decode_dt(seen),  # type: ignore[arg-type]
                    stopped_at=codec.decode_dt(stopped),
                    host=host,
                    pid=pid,
                    health=NodeHealth.from_json(health),
                )
            )
        return out


class ScheduleRegistrySQL:
    """Mixin: as ``NodeRegistrySQL``, for schedule records (times as the node gives them:
    they are the node's own plans, for people to read)."""

    __slots__ = ()

    _sql: Mapping[str, str]

    def _sql_scope(self, what: str, *, write: bool) -> AbstractContextManager[Executor]:
        raise NotImplementedError

    def declare_schedule(self, record: ScheduleRecord) -> None:
        dt = codec.encode_dt
        with self._sql_scope("declare_schedule", write=True) as c:
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
        with self._sql_scope("forget_schedule", write=True) as c:
            c.execute(self._sql["forget_schedule"], [node, name])

    def schedules(self) -> list[ScheduleRecord]:
        with self._sql_scope("schedules", write=False) as c:
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


class PipelineRegistrySQL:
    """Mixin: as ``NodeRegistrySQL``, for pipeline run shapes (one JSON column)."""

    __slots__ = ()

    _sql: Mapping[str, str]

    def _sql_scope(self, what: str, *, write: bool) -> AbstractContextManager[Executor]:
        raise NotImplementedError

    def record_pipeline(self, record: PipelineRecord) -> None:
        shape = json.dumps(
            {
                key: [task_id, list(record.depends_on.get(key, ()))]
                for key, task_id in record.tasks.items()
            },
            ensure_ascii=False,
        )
        with self._sql_scope("record_pipeline", write=True) as c:
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
        with self._sql_scope("pipeline_record", write=False) as c:
            row = c.execute(self._sql["pipeline"], [pipeline_run_id]).fetchone()
        return None if row is None else _pipeline(row)

    def pipeline_records(self, *, limit: int = 50) -> list[PipelineRecord]:
        with self._sql_scope("pipeline_records", write=False) as c:
            rows = c.execute(self._sql["pipelines"], [limit]).fetchall()
        return [_pipeline(row) for row in rows]


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
