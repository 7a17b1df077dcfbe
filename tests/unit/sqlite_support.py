"""What the SQLite store's tests share: tasks, a step of a task's life, and ways to look
into the file the store writes."""

from __future__ import annotations

import sqlite3
import threading
from datetime import UTC, datetime

from chongming_task import (
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_task.stores import SqliteTaskStore

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def sql(store: SqliteTaskStore) -> sqlite3.Connection:
    """The store's own connection, to read or trace the file's SQL directly."""
    return store.connection.conn


def snap(task_id: str, **changes: object) -> TaskSnapshot:
    base = TaskSnapshot(
        task_id=task_id, name="n", status=TaskStatus.QUEUED, status_version=1, created_at=T0
    )
    return base.evolve(**changes)


def new_task(task_id: str) -> tuple[TaskSnapshot, Transition]:
    return snap(task_id), Transition(
        task_id=task_id, version=1, from_status=None, to_status=TaskStatus.QUEUED, at=T0
    )


def life_step(task_id: str, version: int) -> tuple[TaskSnapshot, list[Transition]]:
    moved = snap(task_id, status=TaskStatus.RUNNING, status_version=version, attempt=1)
    return moved, [
        Transition(
            task_id=task_id,
            version=version,
            from_status=TaskStatus.QUEUED,
            to_status=TaskStatus.RUNNING,
            at=T0,
            reason=f"to v{version}",
        )
    ]


def rows_into_the_tables(store: SqliteTaskStore) -> list[str]:
    """The statements written straight into the tables from now on (a batch over 64 rows;
    a smaller one is one statement into the write view)."""
    seen: list[str] = []

    def trace(sql: str) -> None:
        if sql.startswith(("INSERT INTO tasks ", "UPDATE tasks SET", "INSERT INTO transitions")):
            seen.append(sql)

    sql(store).set_trace_callback(trace)
    return seen


def queued_write_errors(store: SqliteTaskStore, calls: list[object]) -> list[BaseException | None]:
    """Run each call on its own thread while the test holds the store's lock, so they all
    queue; then release it: one thread commits them as one batch. Returns each call's
    error (or None)."""
    from typing import Any

    results: list[BaseException | None] = [None] * len(calls)
    threads = []
    store.connection.lock.acquire()
    try:
        for i, call in enumerate(calls):

            def run(i: int = i, call: Any = call) -> None:
                try:
                    call()
                except BaseException as exc:
                    results[i] = exc

            t = threading.Thread(target=run)
            t.start()
            threads.append(t)
        deadline = threading.Event()
        while store.connection.group.queued < len(calls):
            deadline.wait(0.001)
    finally:
        store.connection.lock.release()
    store.connection.group.serve()
    for t in threads:
        t.join(10)
    return results
