"""``InMemoryTaskStore``: the contract in plain dictionaries, for tests and one-shot runs.

It holds record objects and never serializes them, so it cannot catch serialization
mistakes; "works on the memory store" does not mean "works on a real store".
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timedelta

from ..errors import ConcurrencyConflict, StoreError, TaskAlreadyExists
from ..model import Command, Progress, TaskQuery, TaskSnapshot, TaskStatus, Transition, utc
from ..states import TERMINAL


class InMemoryTaskStore:
    """A thread-safe ``TaskStore`` living in this process only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[str, TaskSnapshot] = {}
        self._history: dict[str, dict[int, Transition]] = {}
        self._commands: dict[str, Command] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"InMemoryTaskStore(tasks={len(self._tasks)})"

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("InMemoryTaskStore is closed")

    def create(self, snapshot: TaskSnapshot) -> None:
        with self._lock:
            self._check_open()
            if snapshot.task_id in self._tasks:
                raise TaskAlreadyExists(f"task {snapshot.task_id} already exists")
            self._tasks[snapshot.task_id] = snapshot

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        with self._lock:
            self._check_open()
            current = self._tasks.get(snapshot.task_id)
            if current is None or current.status_version != expect_version:
                raise ConcurrencyConflict.version_mismatch(
                    snapshot.task_id,
                    expect_version,
                    None if current is None else current.status_version,
                )
            # The lease belongs to touch(): carry the stored one over, never the caller's.
            if (snapshot.lease_owner, snapshot.lease_until) != (
                current.lease_owner,
                current.lease_until,
            ):
                snapshot = snapshot.evolve(
                    lease_owner=current.lease_owner, lease_until=current.lease_until
                )
            self._tasks[snapshot.task_id] = snapshot

    def get(self, task_id: str) -> TaskSnapshot | None:
        with self._lock:
            self._check_open()
            return self._tasks.get(task_id)

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        query = query or TaskQuery()
        with self._lock:
            self._check_open()
            found = [s for s in self._tasks.values() if query.matches(s)]
        # sort() is stable: ties keep insertion order; newest_first is the exact reverse.
        found.sort(key=lambda s: s.created_at)
        if query.newest_first:
            found.reverse()
        return found if query.limit is None else found[: query.limit]

    def counts(self) -> dict[TaskStatus, int]:
        with self._lock:
            self._check_open()
            out: dict[TaskStatus, int] = {}
            for snapshot in self._tasks.values():
                out[snapshot.status] = out.get(snapshot.status, 0) + 1
            return out

    def append(self, transition: Transition) -> None:
        with self._lock:
            self._check_open()
            self._history.setdefault(transition.task_id, {}).setdefault(
                transition.version, transition
            )

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        with self._lock:
            self._check_open()
            rows = self._history.get(task_id, {})
            return [rows[v] for v in sorted(rows) if v > since_version]

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
            self._check_open()
            current = self._tasks.get(task_id)
            if current is None:
                return
            self._tasks[task_id] = replace(
                current,
                progress=current.progress if progress is None else progress,
                last_heartbeat_at=(
                    current.last_heartbeat_at if heartbeat_at is None else heartbeat_at
                ),
                lease_owner=current.lease_owner if lease_owner is None else lease_owner,
                lease_until=current.lease_until if lease_until is None else lease_until,
            )

    def submit_command(self, command: Command) -> None:
        with self._lock:
            self._check_open()
            if command.command_id in self._commands:
                raise StoreError(f"command {command.command_id} already exists")
            self._commands[command.command_id] = command

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        now = utc(now, "now")
        until = now + timedelta(seconds=lease_seconds)
        with self._lock:
            self._check_open()
            open_ = [
                c
                for c in self._commands.values()
                if c.finished_at is None and (c.lease_until is None or c.lease_until <= now)
            ]
            open_.sort(key=lambda c: c.created_at)
            claimed = [replace(c, lease_until=until) for c in open_[:limit]]
            for command in claimed:
                self._commands[command.command_id] = command
            return claimed

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        with self._lock:
            self._check_open()
            command = self._commands.get(command_id)
            if command is not None:
                self._commands[command_id] = replace(
                    command, finished_at=utc(now, "now"), outcome=outcome, lease_until=None
                )

    def release_command(self, command_id: str, *, now: datetime) -> None:
        with self._lock:
            self._check_open()
            command = self._commands.get(command_id)
            if command is not None and command.finished_at is None:
                self._commands[command_id] = replace(command, lease_until=None)

    def prune(self, *, keep_terminal: int) -> int:
        if keep_terminal < 0:
            raise ValueError(f"keep_terminal must be >= 0, got {keep_terminal}")
        with self._lock:
            self._check_open()
            terminal = [s for s in self._tasks.values() if s.status in TERMINAL]
            terminal.sort(key=lambda s: s.created_at)
            doomed = terminal[: max(0, len(terminal) - keep_terminal)]
            for snapshot in doomed:
                del self._tasks[snapshot.task_id]
                self._history.pop(snapshot.task_id, None)
            return len(doomed)

    def close(self) -> None:
        self._closed = True
