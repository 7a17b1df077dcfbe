"""SQLite specifics beyond the contract: atomic(), all-or-nothing batches, errors naming
the path, indexes, opening a file another process holds, and binding values."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from contextlib import closing
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from chongming_task import (
    CancellationToken,
    ConcurrencyConflict,
    Controller,
    StoreError,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_task.states import NON_TERMINAL
from chongming_task.stores import SqliteTaskStore
from chongming_task.stores.sqlite import SCHEMA_VERSION
from tests.unit.sqlite_support import (
    T0,
    new_task,
    snap,
    sql,
)


def test_concurrent_writers_are_all_committed_and_visible_to_another_connection(
    tmp_path: Path,
) -> None:
    path = tmp_path / "g.db"
    store = SqliteTaskStore(path)
    barrier = threading.Barrier(8)

    def writer(n: int) -> None:
        barrier.wait()
        for i in range(50):
            store.create(snap(f"w{n}-{i}"))
            store.save(snap(f"w{n}-{i}", status_version=2), expect_version=1)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every write returned only after its commit: a separate connection sees all of them.
    other = sqlite3.connect(path)
    assert other.execute("SELECT COUNT(*), MIN(status_version) FROM tasks").fetchone() == (400, 2)
    other.close()
    store.close()


def test_a_failing_write_rolls_back_only_itself(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "a.db")
    store.create(snap("t1"))
    with pytest.raises(ConcurrencyConflict):
        store.save(snap("t1", status=TaskStatus.RUNNING, status_version=5), expect_version=3)
    store.create(snap("t2"))
    assert [s.task_id for s in store.query()] == ["t1", "t2"]
    assert store.get("t1") == snap("t1")
    store.close()


def test_atomic_is_all_or_nothing(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "a.db")
    with pytest.raises(StoreError), store.atomic():
        store.create(snap("a"))
        store.create(snap("a"))  # duplicate: the whole block rolls back
    assert store.query() == []
    with store.atomic():
        store.create(snap("b"))
        store.create(snap("c"))
    assert len(store.query()) == 2
    store.close()


def test_submit_many_is_all_or_nothing(tmp_path: Path) -> None:
    class DiskFills(SqliteTaskStore):
        full = False

        def create_many(self, items: Sequence[tuple[TaskSnapshot, Transition]]) -> None:
            if self.full:
                raise StoreError("disk full (injected)")
            super().create_many(items)

    store = DiskFills(tmp_path / "m.db")
    with Controller(store, activity_interval=0.02) as c:
        job = c.task(lambda token, x: x * 2, name="double")
        runs = c.submit_many(job, [(1,), (2,), (3,)])
        assert [r.result(5) for r in runs] == [2, 4, 6]
        store.full = True
        with pytest.raises(StoreError, match="injected"):
            c.submit_many(job, [(4,), (5,), (6,)])
        store.full = False
        assert len(store.query()) == 3 and c.held() == []


def test_a_batch_rolls_back_whole_when_one_id_exists(tmp_path: Path) -> None:
    from chongming_task import TaskAlreadyExists, Transition

    store = SqliteTaskStore(tmp_path / "b.db")

    def item(task_id: str) -> tuple[TaskSnapshot, Transition]:
        return snap(task_id), Transition(
            task_id=task_id, version=1, from_status=None, to_status=TaskStatus.QUEUED, at=T0
        )

    store.create_many([item("a")])
    with pytest.raises(TaskAlreadyExists):
        store.create_many([item("b"), item("a"), item("c")])
    assert [s.task_id for s in store.query()] == ["a"] and store.history("b") == []
    store.close()


def test_submit_many_on_a_store_without_transactions_cancels_what_it_stored() -> None:
    """No transaction to roll back: the tasks stored before the failure are recorded as
    cancelled (they never ran), never left queued without a holder."""
    from chongming_task import InMemoryTaskStore
    from chongming_task.testing import FaultyStore

    inner = InMemoryTaskStore()
    store = FaultyStore(inner)
    c = Controller(store, activity_interval=0.02)
    job = c.task(lambda token, x: x, name="echo")
    calls = {"n": 0}

    def third(snapshot: TaskSnapshot) -> bool:
        calls["n"] += 1
        return calls["n"] == 3

    store.fail_when("create", third)
    with pytest.raises(StoreError, match="injected"):
        c.submit_many(job, [(1,), (2,), (3,), (4,)])
    stored = inner.query()
    assert len(stored) == 2 and {s.status for s in stored} == {TaskStatus.CANCELLED}
    assert all("batch submit failed" in (inner.history(s.task_id)[-1].reason or "") for s in stored)
    assert c.held() == []
    c.close()


def test_a_corrupt_file_is_a_clear_store_error_naming_the_path(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-db.db"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match=r"not-a-db\.db.*not a usable SQLite database"):
        SqliteTaskStore(bad)
    assert bad.read_bytes().startswith(b"this is not sqlite")  # untouched


def test_a_missing_file_can_be_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no database at"):
        SqliteTaskStore(tmp_path / "absent.db", create=False)
    assert not (tmp_path / "absent.db").exists()


def test_bucket_totals_count_the_bucketless_without_reading_the_table(tmp_path: Path) -> None:
    """The bucket index holds only tasks with a bucket (schema 9): the totals per bucket
    still count the bucketless ones under None, and no part of the statement reads the
    table (at a million tasks that is seconds)."""
    store = SqliteTaskStore(tmp_path / "b.db")
    try:
        assert store.count_tasks("bucket") == {}
        store.create_many(
            [
                (replace(s, bucket=None if i % 3 == 0 else i % 2), t)
                for i, (s, t) in enumerate(new_task(f"t{i}") for i in range(9))
            ]
        )
        assert store.count_tasks("bucket") == {None: 3, 0: 3, 1: 3}
        queued = frozenset({TaskStatus.QUEUED})
        assert store.count_tasks("bucket", statuses=queued) == {None: 3, 0: 3, 1: 3}
        (index,) = (
            sql(store)
            .execute("SELECT sql FROM sqlite_master WHERE name = 'idx_tasks_bucket'")
            .fetchone()
        )
        assert index.endswith("WHERE bucket IS NOT NULL")
        from chongming_task.stores.sql import load_named

        plan = [
            row[3]
            for row in sql(store).execute(
                "EXPLAIN QUERY PLAN " + load_named("chongming_task.stores.sqlite")["bucket_totals"]
            )
        ]
        assert not [
            step for step in plan if step.startswith("SCAN tasks") and "INDEX" not in step
        ], plan
        assert store.query(TaskQuery(buckets=frozenset({1}))) == store.query(
            TaskQuery(buckets=frozenset({1}), statuses=queued)
        )
        assert len(store.query(TaskQuery(buckets=frozenset({1})))) == 3
    finally:
        store.close()


def test_filters_use_the_indexes(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "i.db")
    plan = " ".join(store.explain_query(TaskQuery(buckets=frozenset({1, 2}))))
    assert "idx_tasks_bucket" in plan
    plan = " ".join(store.explain_query(TaskQuery(statuses=frozenset({TaskStatus.RUNNING}))))
    assert "idx_tasks_status" in plan
    # A node's tasks: newest first by the owner index, but its unfinished ones (few) by
    # the status index, never by walking all the node ever ran.
    mine = TaskQuery(owner="node-a", newest_first=True, limit=51)
    assert "idx_tasks_owner" in " ".join(store.explain_query(mine))
    unfinished = replace(mine, statuses=NON_TERMINAL)
    assert "idx_tasks_status" in " ".join(store.explain_query(unfinished))
    finished = replace(mine, statuses=frozenset({TaskStatus.SUCCEEDED}))
    assert "idx_tasks_owner" in " ".join(store.explain_query(finished))
    store.close()


def test_a_controller_on_a_path_owns_and_closes_its_store(tmp_path: Path) -> None:
    c = Controller(tmp_path / "own.db")

    @c.task(name="one")
    def one(token: CancellationToken) -> int:
        return 1

    assert c.submit(one).result(5) == 1
    c.close()
    with pytest.raises(StoreError, match="closed"):
        c.store.get("x")


def test_mark_lost_is_a_compare_and_set_per_task(tmp_path: Path) -> None:
    """The bulk path reconcile uses on SQLite: a task whose version moved (its holder
    wrote meanwhile) is left alone and gets no transition; the others are marked."""
    from chongming_task import Failure, FailureKind, Transition

    store = SqliteTaskStore(tmp_path / "m.db")
    for task_id in ("a", "b", "c"):
        store.create(snap(task_id, status=TaskStatus.RUNNING, status_version=3))
    store.save(snap("b", status=TaskStatus.SUCCEEDED, status_version=4), expect_version=3)
    failure = Failure(kind=FailureKind.LOST, message="lease expired", carrier_may_run=True)
    now = datetime(2026, 3, 2, tzinfo=UTC)
    marks = [
        (
            snap(t, status=TaskStatus.LOST, status_version=4, ended_at=now, failure=failure),
            Transition(
                task_id=t,
                version=4,
                from_status=TaskStatus.RUNNING,
                to_status=TaskStatus.LOST,
                at=now,
                reason="reconcile",
                actor="me",
            ),
        )
        for t in ("a", "b", "c")
    ]
    assert store.mark_lost(marks) == {"a", "c"}
    lost = store.get("a")
    assert lost is not None and lost.status is TaskStatus.LOST and lost.failure == failure
    assert lost.ended_at == now and lost.status_version == 4
    assert store.get("b").status is TaskStatus.SUCCEEDED  # type: ignore[union-attr]
    assert store.history("b") == [] and len(store.history("a")) == 1
    assert store.mark_lost([]) == set()
    store.close()


def test_write_transitions_is_a_compare_and_set_with_its_trail(tmp_path: Path) -> None:
    from chongming_task import Transition

    store = SqliteTaskStore(tmp_path / "w.db")
    created = Transition(
        task_id="t", version=1, from_status=None, to_status=TaskStatus.QUEUED, at=T0
    )
    store.create_many([(snap("t"), created)])
    running = snap("t", status=TaskStatus.RUNNING, status_version=3)
    steps = [
        Transition(task_id="t", version=v, from_status=f, to_status=to, at=T0)
        for v, f, to in [
            (2, TaskStatus.QUEUED, TaskStatus.STARTING),
            (3, TaskStatus.STARTING, TaskStatus.RUNNING),
        ]
    ]
    store.write_transitions(running, expect_version=1, transitions=steps)
    with pytest.raises(ConcurrencyConflict, match="stored version 3"):
        store.write_transitions(
            snap("t", status=TaskStatus.FAILED, status_version=4),
            expect_version=1,
            transitions=[
                Transition(
                    task_id="t",
                    version=4,
                    from_status=TaskStatus.RUNNING,
                    to_status=TaskStatus.FAILED,
                    at=T0,
                )
            ],
        )
    assert store.get("t") == running  # the losing write changed nothing ...
    assert [t.version for t in store.history("t")] == [1, 2, 3]  # ... and left no trail
    store.close()


def test_a_none_is_bound_as_null_through_the_registered_adapter(tmp_path: Path) -> None:
    """The store registers an adapter for None (sqlite3 formats an exception it throws
    away for each None it finds none for): a None column still lands as NULL."""
    import chongming_task.stores.sqlite.group  # noqa: F401  (registers it)

    assert sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)](None) is None
    store = SqliteTaskStore(tmp_path / "s.db")
    store.create_many([new_task("n1")])
    store.close()
    raw = sqlite3.connect(tmp_path / "s.db")
    try:
        row = raw.execute(
            "SELECT ended_at IS NULL, outcome IS NULL, typeof(ended_at) FROM tasks"
        ).fetchone()
    finally:
        raw.close()
    assert row == (1, 1, "null")


def test_an_adapter_for_none_registered_before_ours_is_kept(tmp_path: Path) -> None:
    """What sqlite3 does with a None in a user's process stays what the user made it."""
    import subprocess
    import sys

    code = (
        "import sqlite3\n"
        "mine = lambda value: value\n"
        "sqlite3.register_adapter(type(None), mine)\n"
        "import chongming_task.stores.sqlite\n"
        "assert sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)] is mine\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_migration_sets_back_the_pragmas_it_changed_as_they_were() -> None:
    """secure_delete reads 2 for FAST, and setting 2 turns it on: the value the copy
    restores is spelled so that it sets back what it read."""
    from chongming_task.stores.sqlite.schema import pragma_value

    conn = sqlite3.connect(":memory:")
    try:
        for setting, read in [("FAST", 2), ("0", 0), ("1", 1)]:
            conn.execute(f"PRAGMA secure_delete = {setting}")
            conn.execute(f"PRAGMA secure_delete = {pragma_value(conn, 'secure_delete')}")
            assert conn.execute("PRAGMA secure_delete").fetchone() == (read,)
        conn.execute("PRAGMA cache_size = -1234")
        assert pragma_value(conn, "cache_size") == "-1234"
    finally:
        conn.close()


def _hold_a_new_file_in_a_write(path: Path) -> sqlite3.Connection:
    """Another process making a new file: its write transaction, still open, in the
    rollback journal (as the switch to WAL holds it)."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("CREATE TABLE other_node_was_here (x)")
    return holder


def test_an_open_waits_for_another_process_making_the_file(tmp_path: Path) -> None:
    # SQLite answers the WAL switch "database is locked" at once here, without its busy
    # handler: nodes started together on a new file failed to open it.
    path = tmp_path / "new.db"
    holder = _hold_a_new_file_in_a_write(path)
    committer = threading.Timer(0.3, holder.execute, ("COMMIT",))
    committer.start()
    try:
        store = SqliteTaskStore(path, timeout=10)
    finally:
        committer.join()
        holder.close()
    try:
        store.create(snap("after-the-wait"))
        assert store.get("after-the-wait") is not None
    finally:
        store.close()
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_an_open_held_off_past_its_timeout_says_the_file_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    holder = _hold_a_new_file_in_a_write(path)
    try:
        with pytest.raises(StoreError, match="database is locked"):
            SqliteTaskStore(path, timeout=0.2)
    finally:
        holder.close()


def test_a_file_a_newer_release_made_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    SqliteTaskStore(path).close()
    with closing(sqlite3.connect(path)) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError) as refused:
        SqliteTaskStore(path)
    assert str(refused.value) == (
        f"{path} has schema version {SCHEMA_VERSION + 1}, made by a newer release; "
        f"this chongming-task reads version {SCHEMA_VERSION}: upgrade chongming-task"
    )
    with closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION + 1,)


def test_prune_deletes_the_trail_rows_of_what_it_prunes_and_no_others(tmp_path: Path) -> None:
    """The trail of a pruned task cannot be read through the store (``history`` finds a
    trail through its task's row, which is gone), so the contract cannot see rows left
    behind: count them in the file."""
    path = tmp_path / "p.db"
    store = SqliteTaskStore(path)
    for i, status in enumerate([TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.RUNNING]):
        store.create(snap(f"t{i}", status=status, created_at=T0.replace(second=i)))
        for version in (2, 3):
            store.append(
                Transition(
                    task_id=f"t{i}", version=version, from_status=None, to_status=status, at=T0
                )
            )
    assert store.prune(keep_terminal=1) == 1  # t0, the oldest finished
    store.close()
    with closing(sqlite3.connect(path)) as raw:
        kept = raw.execute("SELECT task_id, count(*) FROM transitions GROUP BY task_id").fetchall()
    assert sorted(kept) == [("t1", 2), ("t2", 2)]
