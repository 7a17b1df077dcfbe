"""``JsonFileTaskStore``: a complete third-party store in one JSON file.

It shows the *shape* of a store (the contract, no inheritance, serialization through
``stores.codec``); it is NOT a cross-process design. It is correct within one process
only. Two hard lessons are kept in its code:

1. No caching: it re-reads the file on every call. Two instances that each keep a copy
   never see each other's writes, and cross-instance control fails silently (the command
   lands in the controller's copy, the worker never hears of it).
2. Writes replace the file atomically (temp file named with the pid, then
   ``Path.replace``): ``write_text`` in place lets a reader see an empty or half-written
   file. Even so, with no lock between processes, concurrent read-modify-write loses
   updates; ``test_the_naive_file_store_is_not_cross_process_safe`` pins that down. Use
   ``SqliteTaskStore`` to share a store between processes.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from chongming_task import (
    Command,
    ConcurrencyConflict,
    Progress,
    StoreError,
    TaskAlreadyExists,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_task.states import TERMINAL
from chongming_task.stores import codec


class JsonFileTaskStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._closed = False
        if not self.path.exists():
            self._write({"tasks": {}, "history": {}, "commands": {}})

    def __repr__(self) -> str:
        return f"JsonFileTaskStore({str(self.path)!r})"

    # -- file plumbing ----------------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        if self._closed:
            raise StoreError(f"{self!r} is closed")
        data: dict[str, Any] = json.loads(self.path.read_text("utf-8"))
        return data

    def _write(self, data: dict[str, Any]) -> None:
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(data, ensure_ascii=False), "utf-8")
        tmp.replace(self.path)

    def _tasks(self, data: dict[str, Any]) -> list[TaskSnapshot]:
        return [codec.row_to_snapshot(row) for row in data["tasks"].values()]

    # -- task snapshots ---------------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        with self._lock:
            data = self._read()
            if snapshot.task_id in data["tasks"]:
                raise TaskAlreadyExists(f"task {snapshot.task_id} already exists")
            data["tasks"][snapshot.task_id] = codec.snapshot_to_row(snapshot)
            self._write(data)

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        with self._lock:
            data = self._read()
            row = data["tasks"].get(snapshot.task_id)
            if row is None or row["status_version"] != expect_version:
                raise ConcurrencyConflict(
                    f"task {snapshot.task_id}: expected version {expect_version}"
                )
            new = codec.snapshot_to_row(snapshot)
            for column in codec.LEASE_COLUMNS:  # save never writes the lease
                new[column] = row[column]
            data["tasks"][snapshot.task_id] = new
            self._write(data)

    def get(self, task_id: str) -> TaskSnapshot | None:
        with self._lock:
            row = self._read()["tasks"].get(task_id)
        return None if row is None else codec.row_to_snapshot(row)

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        query = query or TaskQuery()
        with self._lock:
            found = [s for s in self._tasks(self._read()) if query.matches(s)]
        return query.ordered(found)

    def counts(self) -> dict[TaskStatus, int]:
        out: dict[TaskStatus, int] = {}
        for snapshot in self.query():
            out[snapshot.status] = out.get(snapshot.status, 0) + 1
        return out

    # -- audit trail ------------------------------------------------------------------------------

    def append(self, transition: Transition) -> None:
        with self._lock:
            data = self._read()
            rows = data["history"].setdefault(transition.task_id, {})
            rows.setdefault(str(transition.version), codec.transition_to_row(transition))
            self._write(data)

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        with self._lock:
            rows = self._read()["history"].get(task_id, {})
        return [
            codec.row_to_transition(rows[v])
            for v in sorted(rows, key=int)
            if int(v) > since_version
        ]

    # -- side channel -----------------------------------------------------------------------------

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        with self._lock:
            data = self._read()
            row = data["tasks"].get(task_id)
            if row is None or row["status"] in {s.value for s in TERMINAL}:
                return  # a late heartbeat or lease never lands on a finished task
            if progress is not None:
                row["progress"] = codec.encode_progress(progress)
            if heartbeat_at is not None:
                row["last_heartbeat_at"] = codec.encode_dt(heartbeat_at)
            if lease_owner is not None:
                row["lease_owner"] = lease_owner
            if lease_until is not None:
                row["lease_until"] = codec.encode_dt(lease_until)
            self._write(data)

    # -- commands ---------------------------------------------------------------------------------

    def submit_command(self, command: Command) -> None:
        with self._lock:
            data = self._read()
            data["commands"][command.command_id] = codec.command_to_row(command)
            self._write(data)

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        until = codec.encode_dt(now + timedelta(seconds=lease_seconds))
        with self._lock:
            data = self._read()
            commands = [codec.row_to_command(r) for r in data["commands"].values()]
            # Arrival order is the order of the object's keys; a task's commands never
            # pass each other (a leased one holds back the ones behind it).
            held: set[str] = set()
            open_: list[Command] = []
            for c in commands:
                if c.finished_at is not None:
                    continue
                if (c.lease_until is not None and c.lease_until > now) or c.task_id in held:
                    held.add(c.task_id)
                elif len(open_) < limit:
                    open_.append(c)
                else:
                    held.add(c.task_id)
            for command in open_:
                data["commands"][command.command_id]["lease_until"] = until
            self._write(data)
            return [codec.row_to_command(data["commands"][c.command_id]) for c in open_]

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        with self._lock:
            data = self._read()
            row = data["commands"].get(command_id)
            if row is not None:
                row.update(finished_at=codec.encode_dt(now), outcome=outcome, lease_until=None)
                self._write(data)

    def release_command(self, command_id: str, *, now: datetime) -> None:
        with self._lock:
            data = self._read()
            row = data["commands"].get(command_id)
            if row is not None and row["finished_at"] is None:
                row["lease_until"] = None
                self._write(data)

    # -- operations -------------------------------------------------------------------------------

    def prune(self, *, keep_terminal: int) -> int:
        with self._lock:
            data = self._read()
            terminal = sorted(
                (s for s in self._tasks(data) if s.status in TERMINAL),
                key=lambda s: s.created_at,
            )
            doomed = terminal[: max(0, len(terminal) - keep_terminal)]
            for snapshot in doomed:
                del data["tasks"][snapshot.task_id]
                data["history"].pop(snapshot.task_id, None)
            self._write(data)
            return len(doomed)

    def close(self) -> None:
        self._closed = True
