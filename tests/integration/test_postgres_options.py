"""``task.configure(...)`` on a real PostgreSQL: a delayed task stored ``queued`` with its
time, priorities, and a schema of the release before the option columns, with a task
in it, migrated in place by the CLI."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import pytest

from chongming_task import CancellationToken, Controller, StoreError, TaskStatus
from chongming_task.stores import codec
from chongming_task.stores.postgres import PostgresTaskStore
from tests.integration.postgres_support import new_schema, pg_dsn, schemas

__all__ = ["pg_dsn", "schemas"]  # fixtures

S = TaskStatus


def _store(dsn: str, schemas: list[str]) -> PostgresTaskStore:
    schema = new_schema()
    schemas.append(schema)
    store = PostgresTaskStore(dsn, schema=schema)
    store.create_schema()
    return store


def test_delayed_and_prioritised_tasks_on_postgres(pg_dsn: str, schemas: list[str]) -> None:
    store = _store(pg_dsn, schemas)
    started: list[str] = []
    gate = threading.Event()

    def hold(token: CancellationToken) -> None:
        gate.wait(10)

    def note(token: CancellationToken, label: str) -> str:
        started.append(label)
        return label

    try:
        with Controller(store, max_workers=1) as node:
            node.task(hold, name="hold")
            node.task(note, name="note")
            later = node.tasks["note"].configure(delay=0.5).submit("later")
            stored = store.get(later.task_id)
            assert stored is not None and stored.status is S.QUEUED
            assert stored.run_at is not None and stored.run_at > datetime.now(UTC)
            blocker = node.tasks["hold"].submit()
            while blocker.status is not S.RUNNING:
                time.sleep(0.005)
            for label, priority in [("low", -1), ("plain", 0), ("top", 5)]:
                node.tasks["note"].configure(priority=priority).submit(label)
            gate.set()
            assert later.result(10) == "later"
            assert node.wait_idle(10)
            assert started[:3] == ["top", "plain", "low"]
            assert store.get(later.task_id).started_at >= stored.run_at  # type: ignore[operator,union-attr]
            assert {s.priority for s in store.query() if s.name == "note"} == {-1, 0, 5}
    finally:
        store.close()


@pytest.mark.parametrize(
    ("version", "added"),
    [(2, (*codec.OPTION_COLUMNS, "trace_context")), (3, ("trace_context",))],
)
def test_a_schema_of_an_earlier_release_is_migrated_with_its_tasks(
    pg_dsn: str, schemas: list[str], version: int, added: tuple[str, ...]
) -> None:
    """Version 2 had no option columns, version 3 no trace context: each is migrated
    in place, its tasks read as submitted without them, and new ones keep theirs."""
    import psycopg

    store = _store(pg_dsn, schemas)
    schema = store.schema
    with Controller(store) as node:
        node.task(lambda token: "kept", name="old")
        kept = node.tasks["old"].submit()
        assert kept.result(10) == "kept"
    store.close()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # as that version made it
        for column in added:
            conn.execute(f"ALTER TABLE {schema}.tasks DROP COLUMN {column}".encode())
        conn.execute(f"UPDATE {schema}.schema_version SET version = {version}".encode())
    older = PostgresTaskStore(pg_dsn, schema=schema)
    try:
        with pytest.raises(StoreError, match="migrate"):
            older.get(kept.task_id)
    finally:
        older.close()
    cli = [sys.executable, "-m", "chongming_task", "--db", pg_dsn, "--pg-schema", schema]
    migrated = subprocess.run([*cli, "migrate"], capture_output=True, text=True, timeout=60)
    assert migrated.returncode == 0, migrated.stderr
    store = PostgresTaskStore(pg_dsn, schema=schema)
    try:
        got = store.get(kept.task_id)
        assert got is not None and got.outcome == "kept" and got.status is S.SUCCEEDED
        assert (got.run_at, got.priority, got.dedupe_key) == (None, 0, None)
        assert got.trace_context is None
        with Controller(store) as node:
            node.task(lambda token: "new", name="new")
            run = node.tasks["new"].configure(priority=7).submit()
            assert run.result(10) == "new"
        assert store.get(run.task_id).priority == 7  # type: ignore[union-attr]
    finally:
        store.close()
