"""SQLite's group commit: side-by-side writes committed together, one statement or one
transaction a batch; writes that may wait ride the next caller's commit; one caller's
fault fails that caller alone."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chongming_task import (
    ConcurrencyConflict,
    Controller,
    TaskQuery,
    TaskStatus,
)
from chongming_task.stores import SqliteTaskStore
from tests.unit.sqlite_support import (
    life_step,
    new_task,
    queued_write_errors,
    rows_into_the_tables,
    snap,
    sql,
)


def test_a_batch_lands_in_one_statement_and_each_caller_sees_its_commit(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "g.db")
    for name in ("a", "b"):
        store.create_many([new_task(name)])
    statements: list[str] = []
    sql(store).set_trace_callback(statements.append)
    a, a_trail = life_step("a", 2)
    b, b_trail = life_step("b", 2)
    results = queued_write_errors(
        store,
        [
            lambda: store.write_transitions(a, expect_version=1, transitions=a_trail),
            lambda: store.create_many([new_task("c"), new_task("d")]),
            lambda: store.write_transitions(b, expect_version=1, transitions=b_trail),
        ],
    )
    sql(store).set_trace_callback(None)
    assert results == [None, None, None]
    # One statement for the three callers (the trace repeats it for each trigger run).
    writes = {s for s in statements if s.startswith("INSERT INTO task_writes")}
    assert len(writes) == 1 and not any(s.startswith("BEGIN") for s in statements), statements
    assert store.get("a") == a and store.get("b") == b
    assert {s.task_id for s in store.query()} == {"a", "b", "c", "d"}
    assert [t.reason for t in store.history("a")] == [None, "to v2"]
    other = sqlite3.connect(tmp_path / "g.db")  # committed: another connection sees it
    assert other.execute("SELECT COUNT(*) FROM transitions").fetchone() == (6,)
    other.close()
    store.close()


def test_a_batch_of_every_kind_over_several_statements_lands_whole(tmp_path: Path) -> None:
    """A batch over 64 rows is written straight into the tables, kind by kind (here 90
    rows: 40 new tasks and 50 compare-and-sets, each carrying its transition) and every
    write lands with its trail."""
    store = SqliteTaskStore(tmp_path / "g.db")
    store.create_many([new_task(f"old{i}") for i in range(50)])
    steps = [life_step(f"old{i}", 2) for i in range(50)]
    calls: list[object] = [
        lambda s=s, t=t: store.write_transitions(s, expect_version=1, transitions=t)
        for s, t in steps
    ]
    calls.append(lambda: store.create_many([new_task(f"new{i}") for i in range(40)]))
    direct = rows_into_the_tables(store)
    assert queued_write_errors(store, calls) == [None] * 51
    sql(store).set_trace_callback(None)
    heads = {sql.split(" (")[0].split(" SET")[0] for sql in direct}  # one per row run
    assert heads == {"INSERT INTO tasks", "UPDATE tasks", "INSERT INTO transitions"}
    for snapshot, trail in steps:
        assert store.get(snapshot.task_id) == snapshot
        assert [t.version for t in store.history(snapshot.task_id)] == [1, 2]
        assert store.history(snapshot.task_id)[1] == trail[0]
    for i in range(40):
        assert store.get(f"new{i}") == snap(f"new{i}")
        assert [t.version for t in store.history(f"new{i}")] == [1]
    store.close()


def test_a_callers_write_queued_while_writes_behind_commit_is_served_at_once(
    tmp_path: Path,
) -> None:
    """A thread committing writes queued behind (``wait()``), once they are in, commits
    the caller's write queued meanwhile (a caller is never left to its safety net)."""

    store = SqliteTaskStore(tmp_path / "g.db")
    store.connection.group.RETRY = 30.0  # were it left behind, its caller would wait this long
    store.create_many([new_task("a")])
    a, a_trail = life_step("a", 2)
    caller = threading.Thread(target=lambda: store.create_many([new_task("b")]))
    started = threading.Event()

    def on_statement(sql: str) -> None:
        if not started.is_set() and sql.startswith("INSERT INTO task_writes"):
            started.set()
            caller.start()
            while not store.connection.group.queued:
                threading.Event().wait(0.001)

    def writer() -> None:
        sql(store).set_trace_callback(on_statement)
        store.write_transitions_behind([(a, 1, a_trail)]).wait()

    writer_thread = threading.Thread(target=writer)
    writer_thread.start()
    writer_thread.join(10)
    caller.join(5)
    assert started.is_set() and not caller.is_alive()
    assert store.get("a") == a and store.get("b") is not None
    sql(store).set_trace_callback(None)
    store.close()


def test_a_nodes_run_writes_are_queued_behind_and_its_creates_are_a_callers(
    tmp_path: Path,
) -> None:
    """Runs' transitions are queued behind the workers and may wait; submit's creates
    are a caller's and never do."""
    store = SqliteTaskStore(tmp_path / "w.db")
    group = store.connection.group
    rows = {"run": {"new": 0, "life": 0}, "behind": {"new": 0, "life": 0}}

    def counted(kind: str) -> Callable[[Sequence[Any]], Any]:
        real = getattr(group, kind)

        def count(requests: Sequence[Any]) -> Any:
            for request in requests:
                rows[kind]["new"] += len(request.new)
                rows[kind]["life"] += len(request.life)
            return real(requests)

        return count

    group.run, group.behind = counted("run"), counted("behind")  # type: ignore[method-assign]
    controller = Controller(store, max_workers=2)
    job = controller.task(lambda token: None, name="noop")
    for run in [controller.submit(job) for _ in range(20)]:
        assert run.wait(10) and run.status is TaskStatus.SUCCEEDED
    controller.close()
    assert rows["run"]["new"] == 20 and rows["behind"]["new"] == 0
    assert rows["behind"]["life"] >= 20 and rows["run"]["life"] == 0


def _stored_version(path: Path, task_id: str) -> int:
    """The version another connection reads (what is committed)."""
    other = sqlite3.connect(path)
    try:
        (version,) = other.execute(
            "SELECT status_version FROM tasks WHERE task_id = ?", (task_id,)
        ).fetchone()
        return int(version)
    finally:
        other.close()


def test_writes_queued_behind_ride_the_next_commit(tmp_path: Path) -> None:
    """``write_transitions_behind`` returns at once with nothing committed; the next
    caller's commit carries the writes (one statement), and each write's outcome is on
    the handle: a conflict fails only its own."""
    path = tmp_path / "b.db"
    store = SqliteTaskStore(path)
    store.create_many([new_task("a"), new_task("b")])
    a, a_trail = life_step("a", 2)
    stale, stale_trail = life_step("b", 5)
    statements: list[str] = []
    pending = store.write_transitions_behind([(a, 1, a_trail), (stale, 4, stale_trail)])
    assert not pending.settled
    assert _stored_version(path, "a") == 1  # nothing committed yet
    sql(store).set_trace_callback(statements.append)
    store.create_many([new_task("c")])  # a caller's commit: takes them along
    sql(store).set_trace_callback(None)
    assert pending.settled
    first, second = pending.errors()
    assert first is None and isinstance(second, ConcurrencyConflict)
    assert store.get("a") == a and [t.version for t in store.history("a")] == [1, 2]
    stored_b = store.get("b")
    assert stored_b is not None and stored_b.status_version == 1  # the loser wrote nothing
    assert [t.version for t in store.history("b")] == [1]
    assert store.get("c") is not None
    views = {sql for sql in statements if sql.startswith("INSERT INTO task_writes")}
    assert any("('new'" in sql and "('life'" in sql for sql in views), views  # one statement
    pending.wait()  # settled: returns at once, as often as asked
    pending.wait()
    store.close()


def test_writes_queued_behind_are_committed_by_serve_or_wait(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    store = SqliteTaskStore(path)
    store.create_many([new_task("a"), new_task("b")])
    a, a_trail = life_step("a", 2)
    b, b_trail = life_step("b", 2)
    served = store.write_transitions_behind([(a, 1, a_trail)])
    served.serve()  # the store is free: committed now, on this thread
    assert served.settled and served.errors() == [None] and _stored_version(path, "a") == 2
    store.connection.group.WAIT = 30.0  # a write that may wait is never due on its own
    waited = store.write_transitions_behind([(b, 1, b_trail)])
    store.connection.lock.acquire()  # busy: wait() waits for whoever holds the store
    done = threading.Event()
    thread = threading.Thread(target=lambda: (waited.wait(), done.set()))
    thread.start()
    assert not done.wait(0.1) and not waited.settled
    store.connection.lock.release()  # released without serving: wait()'s own retry commits it
    thread.join(10)
    assert done.is_set() and waited.errors() == [None] and _stored_version(path, "b") == 2
    store.close()


def test_writes_queued_behind_inside_atomic_are_written_there(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    store = SqliteTaskStore(path)
    store.create_many([new_task("a")])
    a, a_trail = life_step("a", 2)
    with pytest.raises(RuntimeError), store.atomic():
        pending = store.write_transitions_behind([(a, 1, a_trail)])
        assert pending.settled and pending.errors() == [None]
        assert store.get("a") == a  # this thread sees its transaction
        raise RuntimeError("undo")
    assert _stored_version(path, "a") == 1 and [t.version for t in store.history("a")] == [1]
    store.close()


def test_a_conflict_in_a_batch_fails_only_its_own_caller(tmp_path: Path) -> None:
    from chongming_task import TaskAlreadyExists

    store = SqliteTaskStore(tmp_path / "g.db")
    for name in ("a", "b", "x"):
        store.create_many([new_task(name)])
    a, a_trail = life_step("a", 2)
    stale, stale_trail = life_step("b", 5)
    results = queued_write_errors(
        store,
        [
            lambda: store.write_transitions(a, expect_version=1, transitions=a_trail),
            lambda: store.write_transitions(stale, expect_version=4, transitions=stale_trail),
            lambda: store.create_many([new_task("y"), new_task("x")]),  # x exists
            lambda: store.create_many([new_task("z")]),
        ],
    )
    assert results[0] is None and results[3] is None
    assert isinstance(results[1], ConcurrencyConflict) and "stored version 1" in str(results[1])
    assert isinstance(results[2], TaskAlreadyExists)
    assert store.get("a") == a  # the others landed
    stored_b = store.get("b")
    assert stored_b is not None and stored_b.status_version == 1  # the loser changed nothing
    assert [t.version for t in store.history("b")] == [1]  # and left no trail
    assert store.get("y") is None and store.history("y") == []  # all or nothing
    assert store.get("z") is not None
    store.close()


def test_a_conflict_in_a_batch_written_into_the_tables_fails_only_its_own_caller(
    tmp_path: Path,
) -> None:
    """A batch of more than 64 rows goes straight into the tables (no view): a stale
    compare-and-set there undoes the batch too, and the redo fails only its caller."""
    store = SqliteTaskStore(tmp_path / "g.db")
    store.create_many([new_task(f"old{i}") for i in range(40)])
    steps = [life_step(f"old{i}", 2) for i in range(40)]
    stale, stale_trail = life_step("old0", 7)  # expects 6: stored is 1, then 2
    calls: list[object] = [
        lambda s=s, t=t: store.write_transitions(s, expect_version=1, transitions=t)
        for s, t in steps
    ]
    calls.append(lambda: store.write_transitions(stale, expect_version=6, transitions=stale_trail))
    calls.append(lambda: store.create_many([new_task(f"new{i}") for i in range(40)]))
    direct = rows_into_the_tables(store)
    results = queued_write_errors(store, calls)  # 40 + 1 + 40 rows
    sql(store).set_trace_callback(None)
    assert direct and direct[0].startswith("INSERT INTO tasks "), direct
    assert results[:40] == [None] * 40 and results[41] is None
    assert isinstance(results[40], ConcurrencyConflict), results[40]
    for snapshot, trail in steps:
        assert store.get(snapshot.task_id) == snapshot
        assert store.history(snapshot.task_id)[1:] == trail
    assert [t.version for t in store.history("old0")] == [1, 2]  # the loser left nothing
    assert len(store.query(TaskQuery(limit=100))) == 80
    store.close()


def test_a_batch_of_more_than_64_rows_is_still_all_or_nothing(tmp_path: Path) -> None:
    from chongming_task import TaskAlreadyExists

    store = SqliteTaskStore(tmp_path / "g.db")
    store.create_many([new_task("dup")])
    many = [new_task(f"t{i:03}") for i in range(100)]
    with pytest.raises(TaskAlreadyExists):
        store.create_many([*many, new_task("dup")])  # 202 rows, 4 statements
    assert [s.task_id for s in store.query()] == ["dup"]
    store.create_many(many)
    assert len(store.query()) == 101 and len(store.history("t099")) == 1
    with store.atomic():  # inside atomic(): on the caller's thread and transaction
        with pytest.raises(TaskAlreadyExists):
            store.create_many([new_task(f"u{i:03}") for i in range(70)] + [new_task("dup")])
        store.create_many([new_task("v")])
    assert store.get("u000") is None and store.get("v") is not None
    store.close()


def test_writes_inside_atomic_commit_with_it_and_roll_back_with_it(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "g.db")
    with pytest.raises(RuntimeError), store.atomic():
        store.create_many([new_task("gone")])
        raise RuntimeError("roll back")
    assert store.get("gone") is None
    store.close()


def test_an_old_sqlite_file_gains_the_write_view_on_open(tmp_path: Path) -> None:
    """Files made before the group commit have no ``task_writes`` view: opening adds it
    and the data stays."""
    path = tmp_path / "old.db"
    store = SqliteTaskStore(path)
    store.create_many([new_task("kept")])
    store.close()
    raw = sqlite3.connect(path)
    for name in ("task_writes_new", "task_writes_life", "task_writes_trail"):
        raw.execute(f"DROP TRIGGER {name}")
    raw.execute("DROP VIEW task_writes")
    raw.commit()
    raw.close()
    store = SqliteTaskStore(path)
    store.create_many([new_task("new")])
    assert {s.task_id for s in store.query()} == {"kept", "new"}
    store.close()


def test_a_write_queued_behind_a_reader_is_committed_when_the_reader_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Releasing the connection serves the queue: a queued write never waits for its
    writer's retry timer (here an hour, so only the hand-over can commit it)."""
    from chongming_task.stores.sqlite import group as _sqlite_group

    monkeypatch.setattr(_sqlite_group.GroupCommit, "RETRY", 3600.0)
    store = SqliteTaskStore(tmp_path / "g.db")
    finished = threading.Event()

    def writer() -> None:
        store.create_many([new_task("queued")])
        finished.set()

    with store.connection.read("a long read"):
        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        while not store.connection.group.queued:
            finished.wait(0.001)
        assert not finished.is_set()  # queued behind us
    assert finished.wait(10), "the queued write was not committed when the lock came free"
    thread.join()
    assert store.get("queued") is not None
    store.close()


@pytest.mark.parametrize("filler", [0, 70], ids=["one statement", "into the tables"])
def test_a_value_sqlite_cannot_bind_fails_only_its_caller_in_a_batch(
    tmp_path: Path, filler: int
) -> None:
    """Text is not checked before a request joins a batch: the batch fails at bind,
    nothing of it is written, and the redo request by request fails the one caller
    alone (a batch of up to 64 rows is one statement; with 70 more tasks, 73 rows,
    it goes straight into the tables and the bad row comes after some have landed)."""
    from chongming_task.errors import StoreError

    store = SqliteTaskStore(tmp_path / "bind.db")
    bad_snapshot, bad_created = new_task("bad")
    bad = (replace(bad_snapshot, name="not \udcff utf-8"), bad_created)
    try:
        direct = rows_into_the_tables(store)
        results = queued_write_errors(
            store,
            [
                lambda: store.create_many([new_task("a")]),
                lambda: store.create_many([new_task(f"f{i}") for i in range(filler)]),
                lambda: store.create_many([bad]),
                lambda: store.create_many([new_task("b")]),
            ],
        )
        sql(store).set_trace_callback(None)
        assert bool(direct) == bool(filler), direct
        assert results[0] is None and results[1] is None and results[3] is None
        results.pop(1)
        assert len(store.query(TaskQuery(limit=100))) == 2 + filler
        assert isinstance(results[1], StoreError) and "not valid UTF-8" in str(results[1])
        assert store.get("a") is not None and store.get("b") is not None
        assert store.get("bad") is None and store.history("bad") == []
    finally:
        store.close()
