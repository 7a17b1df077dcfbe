"""``JsonRolesStore``: the JSON-file store of ``json_file_store.py`` with the four roles of
``docs/stores.md`` §10 (batched writes, the command channel, the fleet registry,
maintenance), written from that guide's tables and the codec it names.

Like its core, it is correct within one process only: every call reads the file and
replaces it whole under one lock, so "one transaction" is simply one such call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from chongming_task import (
    Command,
    ConcurrencyConflict,
    Progress,
    TaskAlreadyExists,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_task.health import NodeHealth
from chongming_task.late import LateReport
from chongming_task.model import NodeRecord, PipelineRecord, ScheduleRecord, TaskScan
from chongming_task.states import LOSABLE, TERMINAL
from chongming_task.stores import codec
from chongming_task.stores.roles import LifeWrite, Settled, Verdict
from tests.integration.json_file_store import JsonFileTaskStore

_FINISHED = {s.value for s in TERMINAL}
_TABLES = ("nodes", "schedules", "pipelines", "holds", "late")


class JsonRolesStore(JsonFileTaskStore):
    group_commit = False  # one call, one file write: nothing to share

    # -- plumbing ---------------------------------------------------------------------------------

    def _data(self) -> dict[str, Any]:
        """The file's data, with the roles' tables (absent in a file the core made)."""
        data = self._read()
        for key in _TABLES:
            data.setdefault(key, {})
        return data

    @staticmethod
    def _add(data: dict[str, Any], transition: Transition) -> None:
        rows = data["history"].setdefault(transition.task_id, {})
        rows.setdefault(str(transition.version), codec.transition_to_row(transition))

    @staticmethod
    def _held_by_other(row: dict[str, Any], owner: str) -> bool:
        return row["lease_owner"] is not None and row["lease_owner"] != owner

    @staticmethod
    def _claimable_by(data: dict[str, Any], holder: str, task_id: str) -> bool:
        row = data["tasks"].get(task_id)
        return (
            row is None
            or row["lease_owner"] is None
            or row["lease_owner"] == holder
            or row["status"] in _FINISHED
        )

    def _forget(self, data: dict[str, Any], task_ids: set[str]) -> None:
        """Delete tasks with what the roles keep beside them (the guide's "pruned with
        its task"): trail, late report, hold, finished commands, and a pipeline run's
        record once none of its tasks is left."""
        for task_id in task_ids:
            data["tasks"].pop(task_id, None)
            data["history"].pop(task_id, None)
            data["late"].pop(task_id, None)
            data["holds"].pop(task_id, None)
        for command_id, row in list(data["commands"].items()):
            if row["task_id"] in task_ids and row["finished_at"] is not None:
                del data["commands"][command_id]
        for run_id, record in list(data["pipelines"].items()):
            if not any(t in data["tasks"] for t in record["tasks"].values()):
                del data["pipelines"][run_id]

    def prune(self, *, keep_terminal: int) -> int:
        with self._lock:
            data = self._data()
            tasks = [codec.row_to_snapshot(r) for r in data["tasks"].values()]
            terminal = sorted(
                (s for s in tasks if s.status in TERMINAL), key=lambda s: s.created_at
            )
            doomed = {s.task_id for s in terminal[: max(0, len(terminal) - keep_terminal)]}
            self._forget(data, doomed)
            self._write(data)
            return len(doomed)

    # -- BatchedWrites ----------------------------------------------------------------------------

    def create_many(self, items: Sequence[tuple[TaskSnapshot, Transition]]) -> None:
        with self._lock:
            data = self._data()
            self._create_all(data, items)
            self._write(data)

    def _create_all(
        self, data: dict[str, Any], items: Sequence[tuple[TaskSnapshot, Transition]]
    ) -> None:
        for snapshot, _ in items:
            if snapshot.task_id in data["tasks"]:
                raise TaskAlreadyExists(f"task {snapshot.task_id} already exists")
        for snapshot, created in items:
            data["tasks"][snapshot.task_id] = codec.snapshot_to_row(snapshot)
            self._add(data, created)

    def create_deduped(self, snapshot: TaskSnapshot, created: Transition) -> str | None:
        key = snapshot.dedupe_key
        if key is None:
            raise ValueError(f"task {snapshot.task_id} has no dedupe_key")
        with self._lock:
            data = self._data()
            for row in data["tasks"].values():
                if row["dedupe_key"] != key:
                    continue
                if row["status"] not in _FINISHED:
                    return str(row["task_id"])
                ended = codec.decode_dt(row["ended_at"])
                window = row["dedupe_window"]
                if (
                    row["status"] == TaskStatus.SUCCEEDED.value
                    and ended is not None
                    and window is not None
                    and ended + timedelta(seconds=float(window)) > snapshot.created_at
                ):
                    return str(row["task_id"])
            self._create_all(data, [(snapshot, created)])
            self._write(data)
        return None

    def write_transitions(
        self, snapshot: TaskSnapshot, *, expect_version: int, transitions: Sequence[Transition]
    ) -> None:
        with self._lock:
            data = self._data()
            self._write_one(data, snapshot, expect_version, transitions)
            self._write(data)

    def _write_one(
        self,
        data: dict[str, Any],
        snapshot: TaskSnapshot,
        expect_version: int,
        transitions: Sequence[Transition],
    ) -> None:
        row = data["tasks"].get(snapshot.task_id)
        if row is None or row["status_version"] != expect_version:
            raise ConcurrencyConflict(f"task {snapshot.task_id}: expected version {expect_version}")
        new = codec.snapshot_to_row(snapshot)
        for column in codec.LIFE_COLUMNS:
            row[column] = new[column]
        for transition in transitions:
            self._add(data, transition)

    def write_transitions_together(self, writes: Sequence[LifeWrite]) -> list[BaseException | None]:
        errors: list[BaseException | None] = []
        with self._lock:
            data = self._data()
            for snapshot, expect_version, transitions in writes:
                # Each write alone: a copy of the task's rows, put back only if it held.
                before = json.dumps([data["tasks"], data["history"]])
                try:
                    self._write_one(data, snapshot, expect_version, transitions)
                except Exception as exc:
                    data["tasks"], data["history"] = json.loads(before)
                    errors.append(exc)
                else:
                    errors.append(None)
            self._write(data)
        return errors

    def write_transitions_behind(self, writes: Sequence[LifeWrite]) -> Settled:
        return Settled(self.write_transitions_together(writes))

    def renew_leases(self, task_ids: Sequence[str], *, owner: str, until: datetime) -> list[str]:
        renewed: list[str] = []
        with self._lock:
            data = self._data()
            for task_id in task_ids:
                row = data["tasks"].get(task_id)
                if row is None or row["status"] in _FINISHED or self._held_by_other(row, owner):
                    continue
                row["lease_owner"], row["lease_until"] = owner, codec.encode_dt(until)
                renewed.append(task_id)
            self._write(data)
        return renewed

    def write_activity(
        self, items: Sequence[tuple[str, Progress | None, datetime | None]], *, owner: str
    ) -> list[str]:
        written: list[str] = []
        with self._lock:
            data = self._data()
            for task_id, progress, heartbeat_at in items:
                row = data["tasks"].get(task_id)
                if row is None or row["status"] in _FINISHED or self._held_by_other(row, owner):
                    continue
                if progress is not None:
                    row["progress"] = codec.encode_progress(progress)
                if heartbeat_at is not None:
                    row["last_heartbeat_at"] = codec.encode_dt(heartbeat_at)
                written.append(task_id)
            self._write(data)
        return written

    def mark_lost(self, marks: Sequence[tuple[TaskSnapshot, Transition]]) -> set[str]:
        with self._lock:
            data = self._data()
            won = self._mark(data, marks)
            self._write(data)
        return won

    def _mark(
        self, data: dict[str, Any], marks: Sequence[tuple[TaskSnapshot, Transition]]
    ) -> set[str]:
        won: set[str] = set()
        for marked, transition in marks:
            row = data["tasks"].get(marked.task_id)
            if row is None or row["status_version"] != transition.version - 1:
                continue
            new = codec.snapshot_to_row(marked)
            for column in ("status", "status_version", "ended_at", "failure"):
                row[column] = new[column]
            self._add(data, transition)
            won.add(marked.task_id)
        return won

    # -- CommandChannel ---------------------------------------------------------------------------

    def subscribe_commands(self, wake: Callable[[], None]) -> None:
        return None  # no wake-up reaches another instance: nodes poll

    def subscribe_commands_for(self, holder: str, wake: Callable[[], None]) -> None:
        return None

    def subscribe_transitions(self, wake: Callable[[], None]) -> None:
        return None

    def claim_commands_for(
        self, holder: str, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        until = codec.encode_dt(now + timedelta(seconds=lease_seconds))
        with self._lock:
            data = self._data()
            held: set[str] = set()
            picked: list[str] = []
            for row in data["commands"].values():
                command = codec.row_to_command(row)
                if command.finished_at is not None:
                    continue
                if not self._claimable_by(data, holder, command.task_id):
                    continue  # all of the task's commands are out
                leased = command.lease_until is not None and command.lease_until > now
                if leased or command.task_id in held or len(picked) == limit:
                    held.add(command.task_id)
                    continue
                picked.append(command.command_id)
            for command_id in picked:
                data["commands"][command_id]["lease_until"] = until
            self._write(data)
            return [codec.row_to_command(data["commands"][c]) for c in picked]

    def pending_commands(self, task_id: str) -> list[Command]:
        with self._lock:
            rows = self._data()["commands"].values()
            return [
                codec.row_to_command(r)
                for r in rows
                if r["task_id"] == task_id and r["finished_at"] is None
            ]

    def finished_commands(self, *, after: datetime, limit: int = 500) -> list[Command]:
        with self._lock:
            rows = self._data()["commands"].values()
            done = [codec.row_to_command(r) for r in rows if r["finished_at"] is not None]
        done = [c for c in done if c.finished_at is not None and c.finished_at > after]
        done.sort(key=lambda c: c.finished_at or after)
        return done[:limit]

    def hold_task(self, task_id: str, *, since: datetime, by: str) -> None:
        with self._lock:
            data = self._data()
            data["holds"][task_id] = [codec.encode_dt(since), by]
            self._write(data)

    def release_hold(self, task_id: str) -> None:
        with self._lock:
            data = self._data()
            if data["holds"].pop(task_id, None) is not None:
                self._write(data)

    def holds(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 1000
    ) -> dict[str, datetime]:
        with self._lock:
            kept = self._data()["holds"]
        found = [
            (codec.decode_dt(since), task_id)
            for task_id, (since, _) in kept.items()
            if task_ids is None or task_id in task_ids
        ]
        found.sort(key=lambda pair: pair[0])  # type: ignore[arg-type,return-value]
        if task_ids is None:
            found = found[:limit]
        return {task_id: since for since, task_id in found if since is not None}

    # -- FleetRegistry ----------------------------------------------------------------------------

    def declare_node(self, record: NodeRecord) -> None:
        with self._lock:
            data = self._data()
            data["nodes"][record.node] = {
                "node": record.node,
                "buckets": None if record.buckets is None else sorted(record.buckets),
                "num_buckets": record.num_buckets,
                "ttl_seconds": record.ttl_seconds,
                "started_at": codec.encode_dt(record.started_at),
                "seen_at": codec.encode_dt(record.seen_at),
                "stopped_at": None,
                "host": record.host,
                "pid": record.pid,
                "health": None if record.health is None else record.health.to_json(),
            }
            self._write(data)

    def refresh_node(self, node: str, *, now: datetime, health: NodeHealth | None = None) -> bool:
        with self._lock:
            data = self._data()
            row = data["nodes"].get(node)
            if row is None or row["stopped_at"] is not None:
                return False
            row["seen_at"] = codec.encode_dt(now)
            if health is not None:
                row["health"] = health.to_json()
            self._write(data)
            return True

    def pulse_node(
        self, node: str, *, now: datetime, health: NodeHealth | None = None
    ) -> int | None:
        if not self.refresh_node(node, now=now, health=health):
            return None
        with self._lock:
            data = self._data()
        count = 0
        for row in data["commands"].values():
            command = codec.row_to_command(row)
            free = command.lease_until is None or command.lease_until <= now
            if (
                command.finished_at is None
                and free
                and self._claimable_by(data, node, command.task_id)
            ):
                count += 1
        return count

    def retire_node(self, node: str, *, now: datetime) -> None:
        with self._lock:
            data = self._data()
            row = data["nodes"].get(node)
            if row is not None:
                row["stopped_at"] = codec.encode_dt(now)
                self._write(data)

    def nodes(self) -> list[NodeRecord]:
        with self._lock:
            rows = list(self._data()["nodes"].values())
        return [
            NodeRecord(
                node=r["node"],
                buckets=None if r["buckets"] is None else frozenset(r["buckets"]),
                num_buckets=r["num_buckets"],
                ttl_seconds=r["ttl_seconds"],
                started_at=codec.decode_dt(r["started_at"]),  # type: ignore[arg-type]
                seen_at=codec.decode_dt(r["seen_at"]),  # type: ignore[arg-type]
                stopped_at=codec.decode_dt(r["stopped_at"]),
                host=r["host"],
                pid=r["pid"],
                health=NodeHealth.from_json(r["health"]),
            )
            for r in rows
        ]

    def declare_schedule(self, record: ScheduleRecord) -> None:
        with self._lock:
            data = self._data()
            data["schedules"][json.dumps([record.node, record.name])] = {
                "node": record.node,
                "name": record.name,
                "task": record.task,
                "trigger": record.trigger,
                "updated_at": codec.encode_dt(record.updated_at),
                "next_fire_at": codec.encode_dt(record.next_fire_at),
                "last_fired_at": codec.encode_dt(record.last_fired_at),
                "last_task_id": record.last_task_id,
                "fired": record.fired,
                "skipped": record.skipped,
            }
            self._write(data)

    def forget_schedule(self, node: str, name: str) -> None:
        with self._lock:
            data = self._data()
            if data["schedules"].pop(json.dumps([node, name]), None) is not None:
                self._write(data)

    def schedules(self) -> list[ScheduleRecord]:
        with self._lock:
            rows = list(self._data()["schedules"].values())
        records = [
            ScheduleRecord(
                node=r["node"],
                name=r["name"],
                task=r["task"],
                trigger=r["trigger"],
                updated_at=codec.decode_dt(r["updated_at"]),  # type: ignore[arg-type]
                next_fire_at=codec.decode_dt(r["next_fire_at"]),
                last_fired_at=codec.decode_dt(r["last_fired_at"]),
                last_task_id=r["last_task_id"],
                fired=r["fired"],
                skipped=r["skipped"],
            )
            for r in rows
        ]
        return sorted(records, key=lambda r: (r.node, r.name))

    def record_pipeline(self, record: PipelineRecord) -> None:
        with self._lock:
            data = self._data()
            data["pipelines"].pop(record.pipeline_run_id, None)  # recorded again: newest
            data["pipelines"][record.pipeline_run_id] = {
                "pipeline_run_id": record.pipeline_run_id,
                "name": record.name,
                "node": record.node,
                "created_at": codec.encode_dt(record.created_at),
                "tasks": dict(record.tasks),
                "depends_on": {k: list(v) for k, v in record.depends_on.items()},
            }
            self._write(data)

    @staticmethod
    def _pipeline(r: dict[str, Any]) -> PipelineRecord:
        return PipelineRecord(
            pipeline_run_id=r["pipeline_run_id"],
            name=r["name"],
            node=r["node"],
            created_at=codec.decode_dt(r["created_at"]),  # type: ignore[arg-type]
            tasks=r["tasks"],
            depends_on={k: tuple(v) for k, v in r["depends_on"].items()},
        )

    def pipeline_record(self, pipeline_run_id: str) -> PipelineRecord | None:
        with self._lock:
            row = self._data()["pipelines"].get(pipeline_run_id)
        return None if row is None else self._pipeline(row)

    def pipeline_records(self, *, limit: int = 50) -> list[PipelineRecord]:
        with self._lock:
            rows = list(self._data()["pipelines"].values())
        records = [self._pipeline(r) for r in rows]
        records.sort(key=lambda r: r.created_at, reverse=True)
        return records[:limit]

    # -- Maintenance ------------------------------------------------------------------------------

    def count_tasks(
        self, by: str, *, statuses: frozenset[TaskStatus] | None = None
    ) -> dict[Any, int]:
        counts: dict[Any, int] = {}
        for s in self.query():
            if statuses is not None and s.status not in statuses:
                continue
            value = (s.bucket, s.status) if by == "bucket_status" else getattr(s, by)
            counts[value] = counts.get(value, 0) + 1
        return counts

    def _changed_at(self, s: TaskSnapshot) -> datetime:
        trail = [t for t in self.history(s.task_id) if t.version == s.status_version]
        return trail[0].at if trail else s.created_at

    def scan_tasks(self, scan: TaskScan) -> tuple[int, list[TaskSnapshot]]:
        kept = []
        for s in self.query():  # created_at, then insertion order
            if s.status not in scan.statuses:
                continue
            if scan.buckets is not None and s.bucket not in scan.buckets:
                continue
            if scan.outside is not None and s.bucket is not None and s.bucket in scan.outside:
                continue
            expired = scan.lease_expired_at
            if expired is not None and s.lease_until is not None and s.lease_until > expired:
                continue
            cut = scan.unchanged_since
            if cut is not None and (s.created_at > cut or self._changed_at(s) > cut):
                continue
            kept.append(s)
        return len(kept), kept if scan.limit is None else kept[: scan.limit]

    def ended_timeline(
        self, *, since: datetime, width: timedelta
    ) -> dict[tuple[int, TaskStatus], int]:
        if since.tzinfo is None:
            raise ValueError("since must be timezone-aware")
        step = width // timedelta(microseconds=1)
        if step < 1:
            raise ValueError("width must be at least a microsecond")
        slots: dict[tuple[int, TaskStatus], int] = {}
        for s in self.query():
            if s.status not in TERMINAL or s.ended_at is None or s.ended_at < since:
                continue
            slot = ((s.ended_at - since) // timedelta(microseconds=1)) // step
            slots[(slot, s.status)] = slots.get((slot, s.status), 0) + 1
        return slots

    def mark_expired_lost(
        self,
        scan: TaskScan,
        *,
        exclude: frozenset[str],
        at: datetime,
        actor: str,
        verdict: Verdict,
    ) -> list[str]:
        if scan.statuses - LOSABLE:
            raise ValueError("the state table allows no move to lost from some of these")
        _, expired = self.scan_tasks(scan)
        marks = []
        for s in expired:
            if s.task_id in exclude:
                continue
            failure, reason = verdict(s.lease_owner)
            version = s.status_version + 1
            marked = s.evolve(
                status=TaskStatus.LOST, status_version=version, ended_at=at, failure=failure
            )
            transition = Transition(
                task_id=s.task_id,
                version=version,
                from_status=s.status,
                to_status=TaskStatus.LOST,
                at=at,
                reason=reason,
                actor=actor,
            )
            marks.append((marked, transition))
        with self._lock:
            data = self._data()
            won = self._mark(data, marks)
            self._write(data)
        return [marked.task_id for marked, _ in marks if marked.task_id in won]

    @staticmethod
    def _check_prune(before: datetime, statuses: frozenset[TaskStatus] | None, limit: int) -> None:
        if before.tzinfo is None:
            raise ValueError("before must be timezone-aware")
        if statuses is not None and statuses - TERMINAL:
            raise ValueError("only finished tasks are pruned")
        if limit < 1:
            raise ValueError("limit must be at least 1")

    def _ended(
        self,
        before: datetime,
        statuses: frozenset[TaskStatus] | None,
        buckets: frozenset[int] | None,
    ) -> list[TaskSnapshot]:
        return [
            s
            for s in self.query()
            if s.status in (statuses or TERMINAL)
            and s.ended_at is not None
            and s.ended_at < before
            and (buckets is None or s.bucket in buckets)
        ]

    def prune_ended(
        self,
        *,
        before: datetime,
        statuses: frozenset[TaskStatus] | None = None,
        buckets: frozenset[int] | None = None,
        limit: int = 500,
    ) -> int:
        self._check_prune(before, statuses, limit)
        doomed = self._ended(before, statuses, buckets)[:limit]
        with self._lock:
            data = self._data()
            self._forget(data, {s.task_id for s in doomed})
            self._write(data)
        return len(doomed)

    def count_ended(
        self,
        *,
        before: datetime,
        statuses: frozenset[TaskStatus] | None = None,
        buckets: frozenset[int] | None = None,
    ) -> int:
        self._check_prune(before, statuses, 1)
        return len(self._ended(before, statuses, buckets))

    def _finished_before(self, data: dict[str, Any], before: datetime) -> list[Command]:
        done = [codec.row_to_command(r) for r in data["commands"].values()]
        old = [c for c in done if c.finished_at is not None and c.finished_at < before]
        return sorted(old, key=lambda c: c.finished_at or before)

    def prune_finished_commands(self, *, before: datetime, limit: int = 500) -> int:
        self._check_prune(before, None, limit)
        with self._lock:
            data = self._data()
            doomed = self._finished_before(data, before)[:limit]
            for command in doomed:
                del data["commands"][command.command_id]
            self._write(data)
        return len(doomed)

    def count_finished_commands(self, *, before: datetime) -> int:
        with self._lock:
            return len(self._finished_before(self._data(), before))

    def record_late_report(self, report: LateReport) -> None:
        with self._lock:
            data = self._data()
            data["late"].pop(report.task_id, None)
            data["late"][report.task_id] = {
                "task_id": report.task_id,
                "reported_by": report.reported_by,
                "reported_at": codec.encode_dt(report.reported_at),
                "status": report.status.value,
                "stored_status": report.stored_status.value,
                "ended_at": codec.encode_dt(report.ended_at),
                "outcome": codec.encode_json(report.outcome),
                "failure": codec.encode_failure(report.failure),
            }
            self._write(data)

    def late_reports(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 100
    ) -> list[LateReport]:
        with self._lock:
            rows = list(self._data()["late"].values())
        reports = [
            LateReport(
                task_id=r["task_id"],
                reported_by=r["reported_by"],
                reported_at=codec.decode_dt(r["reported_at"]),  # type: ignore[arg-type]
                status=TaskStatus(r["status"]),
                stored_status=TaskStatus(r["stored_status"]),
                ended_at=codec.decode_dt(r["ended_at"]),
                outcome=codec.decode_json(r["outcome"]),
                failure=codec.decode_failure(r["failure"]),
            )
            for r in rows
            if task_ids is None or r["task_id"] in task_ids
        ]
        reports.sort(key=lambda r: r.reported_at, reverse=True)
        return reports[:limit]

    def count_late_reports(self) -> int:
        with self._lock:
            return len(self._data()["late"])
