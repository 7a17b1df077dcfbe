"""A task's stored trace context (``TaskSnapshot.trace_context``): kept by every store
through a task's whole life, shown by ``show`` and ``--json``, and added to a file of
the release before it without losing its tasks."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from chongming_task import Controller, TaskStatus, present
from chongming_task.stores import codec
from chongming_task.stores.sqlite import SCHEMA_VERSION, SqliteTaskStore
from tests.unit.older_files import older_file

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_task_keeps_its_trace_context_through_its_life(tmp_path: Path) -> None:
    """Fixed at create: every later write of the task (start, end, a catch-up) keeps it."""
    store = SqliteTaskStore(tmp_path / "tasks.db")
    try:
        at = datetime(2026, 1, 1, tzinfo=UTC)
        made = codec.values_to_snapshot(
            ["t1", "job", "queued", 1, 0, "[]", None, None, None, "n", codec.encode_dt(at)]
            + [None] * 8
            + [None, 0, None, None, None, f"{PARENT} k=v"]
        )
        store.create(made)
        running = made.evolve(status=TaskStatus.RUNNING, status_version=2, attempt=1)
        store.save(running, expect_version=1)
        got = store.get("t1")
        assert got is not None and got.trace_context == f"{PARENT} k=v"
        with Controller(store) as node:  # the runtime's own writes keep it as well
            node.task(lambda token: "ok", name="plain")
            run = node.tasks["plain"].submit()
            assert run.result(10) == "ok"
        assert store.get(run.task_id).trace_context is None  # type: ignore[union-attr]
    finally:
        store.close()


def test_show_and_json_give_the_trace() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    with_trace = codec.values_to_snapshot(
        ["t1", "job", "queued", 1, 0, "[]", None, None, None, "n", codec.encode_dt(at)]
        + [None] * 8
        + [None, 0, None, None, None, PARENT]
    )
    shown = present.show_text(with_trace, at)
    assert "trace" in shown and "4bf92f3577b34da6a3ce929d0e0e4736" in shown
    assert present.snapshot_json(with_trace)["trace_context"] == PARENT
    plain = with_trace.evolve(trace_context=None)
    assert "4bf92f" not in present.show_text(plain, at)
    assert present.snapshot_json(plain)["trace_context"] is None


def test_a_schema_13_file_with_tasks_gains_the_trace_context(tmp_path: Path) -> None:
    """A file as the release before the trace context made it, with a task and its trail:
    opened, it is upgraded in place; the task reads with none, and a new one keeps its
    own."""
    path = tmp_path / "v13.db"
    old = [c for c in codec.TASK_COLUMNS if c != "trace_context"]
    at = codec.encode_dt(datetime(2026, 1, 1, tzinfo=UTC))
    values = ["old", "echo", "succeeded", 1, 1, "[]", None, None, None, "n", at]
    values += [at, at, None, None, None, '"kept"', None, None, None, 3, None, None, None]
    older_file(path, 13, old, values)
    store = SqliteTaskStore(path, create=False)
    try:
        kept = store.get("old")
        assert kept is not None and kept.outcome == "kept" and kept.priority == 3
        assert kept.trace_context is None
        assert [t.reason for t in store.history("old")] == ["made by the older release"]
        made = kept.evolve(task_id="new", trace_context=PARENT)
        store.create(made)
        assert store.get("new") == made
    finally:
        store.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    check.close()
