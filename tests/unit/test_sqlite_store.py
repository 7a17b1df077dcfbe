"""SQLite specifics beyond the contract: group commit, atomic(), errors naming the path."""

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

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def sql(store: SqliteTaskStore) -> sqlite3.Connection:
    """The store's own connection, to read or trace the file's SQL directly."""
    return store.connection.conn


def snap(task_id: str, **changes: object) -> TaskSnapshot:
    base = TaskSnapshot(
        task_id=task_id, name="n", status=TaskStatus.QUEUED, status_version=1, created_at=T0
    )
    return base.evolve(**changes)


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
                for i, (s, t) in enumerate(_created(f"t{i}") for i in range(9))
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
        from chongming_task.stores._sql import load_named

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


# -- group commit -------------------------------------------------------------------------------


def _created(task_id: str) -> tuple[TaskSnapshot, Transition]:
    return snap(task_id), Transition(
        task_id=task_id, version=1, from_status=None, to_status=TaskStatus.QUEUED, at=T0
    )


def _step(task_id: str, version: int) -> tuple[TaskSnapshot, list[Transition]]:
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


def _into_the_tables(store: SqliteTaskStore) -> list[str]:
    """The statements written straight into the tables from now on (a batch over 64 rows;
    a smaller one is one statement into the write view)."""
    seen: list[str] = []

    def trace(sql: str) -> None:
        if sql.startswith(("INSERT INTO tasks ", "UPDATE tasks SET", "INSERT INTO transitions")):
            seen.append(sql)

    sql(store).set_trace_callback(trace)
    return seen


def _queued_writes(store: SqliteTaskStore, calls: list[object]) -> list[BaseException | None]:
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
        while len(store.connection.group._queue) < len(calls):
            deadline.wait(0.001)
    finally:
        store.connection.lock.release()
    store.connection.group.serve()
    for t in threads:
        t.join(10)
    return results


def test_a_batch_lands_in_one_statement_and_each_caller_sees_its_commit(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "g.db")
    for name in ("a", "b"):
        store.create_many([_created(name)])
    statements: list[str] = []
    sql(store).set_trace_callback(statements.append)
    a, a_trail = _step("a", 2)
    b, b_trail = _step("b", 2)
    results = _queued_writes(
        store,
        [
            lambda: store.write_transitions(a, expect_version=1, transitions=a_trail),
            lambda: store.create_many([_created("c"), _created("d")]),
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
    store.create_many([_created(f"old{i}") for i in range(50)])
    steps = [_step(f"old{i}", 2) for i in range(50)]
    calls: list[object] = [
        lambda s=s, t=t: store.write_transitions(s, expect_version=1, transitions=t)
        for s, t in steps
    ]
    calls.append(lambda: store.create_many([_created(f"new{i}") for i in range(40)]))
    direct = _into_the_tables(store)
    assert _queued_writes(store, calls) == [None] * 51
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


def test_a_write_that_may_wait_rides_with_the_next_callers_commit(tmp_path: Path) -> None:
    """A write from a thread that lets its writes wait (the node's writer) that finds
    the store busy is left queued by the thread that commits meanwhile, and lands in
    the next caller's statement: one commit for both, each caller told of its own."""
    from chongming_task.stores._hints import let_writes_wait

    store = SqliteTaskStore(tmp_path / "g.db")
    store.connection.group._WAIT = 30.0  # long enough that only the next caller can take it
    store.create_many([_created("a")])
    a, a_trail = _step("a", 2)
    writer_done = threading.Event()
    queued_behind = threading.Event()

    def writer() -> None:
        let_writes_wait()
        store.write_transitions(a, expect_version=1, transitions=a_trail)
        writer_done.set()

    writer_thread = threading.Thread(target=writer)
    statements: set[str] = set()  # each once (the trace repeats one per trigger run)

    def on_statement(sql: str) -> None:
        if not sql.startswith("INSERT INTO task_writes"):
            return
        statements.add(sql)
        if not queued_behind.is_set():  # the first caller's ("b") statement is running
            writer_thread.start()
            while not store.connection.group._waiting:
                queued_behind.wait(0.001)
            queued_behind.set()

    sql(store).set_trace_callback(on_statement)
    store.create_many([_created("b")])  # runs its statement with the writer queued behind
    assert queued_behind.is_set()
    assert not writer_done.wait(0.2), "committed the waiting write with its own"
    other = sqlite3.connect(tmp_path / "g.db")  # not yet written (a read of the store
    assert other.execute(  # would commit it: every other release of its lock serves all)
        "SELECT status_version FROM tasks WHERE task_id = 'a'"
    ).fetchone() == (1,)
    other.close()
    store.create_many([_created("c")])  # the next caller: takes the writer's write along
    assert writer_done.wait(10)
    writer_thread.join(10)
    sql(store).set_trace_callback(None)
    assert len(statements) == 2, statements
    assert any("('new'" in sql and "('life'" in sql for sql in statements), statements
    assert store.get("a") == a and [t.version for t in store.history("a")] == [1, 2]
    assert store.get("b") is not None and store.get("c") is not None
    store.close()


def test_a_write_that_may_wait_lands_alone_when_no_caller_comes(tmp_path: Path) -> None:
    from chongming_task.stores._hints import let_writes_wait, writes_can_wait

    store = SqliteTaskStore(tmp_path / "g.db")
    store.create_many([_created("a")])
    a, a_trail = _step("a", 2)
    assert not writes_can_wait()  # this thread's writes are a caller's
    outcome: list[object] = []

    def writer() -> None:
        let_writes_wait()
        outcome.append(writes_can_wait())
        store.write_transitions(a, expect_version=1, transitions=a_trail)

    store.connection.lock.acquire()  # busy: the writer queues behind it
    thread = threading.Thread(target=writer)
    thread.start()
    while not store.connection.group._waiting:
        threading.Event().wait(0.001)
    store.connection.lock.release()  # released without serving the queue: nobody else writes
    thread.join(10)
    assert not thread.is_alive() and outcome == [True]
    assert store.get("a") == a
    store.close()


def test_a_callers_write_queued_behind_one_that_may_wait_is_served_at_once(
    tmp_path: Path,
) -> None:
    """The other way round: the writer's thread, once its own write is in, commits
    the caller's write queued meanwhile (a caller is never left to its safety net)."""
    from chongming_task.stores._hints import let_writes_wait

    store = SqliteTaskStore(tmp_path / "g.db")
    store.connection.group._RETRY = 30.0  # were it left behind, its caller would wait this long
    store.create_many([_created("a")])
    a, a_trail = _step("a", 2)
    caller = threading.Thread(target=lambda: store.create_many([_created("b")]))
    started = threading.Event()

    def on_statement(sql: str) -> None:
        if not started.is_set() and sql.startswith("INSERT INTO task_writes"):
            started.set()
            caller.start()
            while not store.connection.group._queue:
                threading.Event().wait(0.001)

    def writer() -> None:
        let_writes_wait()
        sql(store).set_trace_callback(on_statement)
        store.write_transitions(a, expect_version=1, transitions=a_trail)

    writer_thread = threading.Thread(target=writer)
    writer_thread.start()
    writer_thread.join(10)
    caller.join(5)
    assert started.is_set() and not caller.is_alive()
    assert store.get("a") == a and store.get("b") is not None
    sql(store).set_trace_callback(None)
    store.close()


def test_the_nodes_writer_is_the_thread_whose_writes_may_wait(tmp_path: Path) -> None:
    """Runs' transitions come from the node's writer and may wait; submit's creates
    are a caller's and never do."""
    from collections import deque

    class Counted(deque):  # type: ignore[type-arg]
        def __init__(self) -> None:
            super().__init__()
            self.rows = {"new": 0, "life": 0}

        def extend(self, requests: object) -> None:
            for request in requests:  # type: ignore[attr-defined]
                self.rows["new"] += len(request.new)
                self.rows["life"] += len(request.life)
            super().extend(requests)  # type: ignore[arg-type]

    store = SqliteTaskStore(tmp_path / "w.db")
    waiting, callers = Counted(), Counted()
    store.connection.group._waiting, store.connection.group._queue = waiting, callers
    controller = Controller(store, max_workers=2)
    job = controller.task(lambda token: None, name="noop")
    for run in [controller.submit(job) for _ in range(20)]:
        assert run.wait(10) and run.status is TaskStatus.SUCCEEDED
    controller.close()
    assert callers.rows["new"] == 20 and waiting.rows["new"] == 0
    assert waiting.rows["life"] >= 20 and callers.rows["life"] == 0


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
    store.create_many([_created("a"), _created("b")])
    a, a_trail = _step("a", 2)
    stale, stale_trail = _step("b", 5)
    statements: list[str] = []
    pending = store.write_transitions_behind([(a, 1, a_trail), (stale, 4, stale_trail)])
    assert not pending.settled
    assert _stored_version(path, "a") == 1  # nothing committed yet
    sql(store).set_trace_callback(statements.append)
    store.create_many([_created("c")])  # a caller's commit: takes them along
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
    store.create_many([_created("a"), _created("b")])
    a, a_trail = _step("a", 2)
    b, b_trail = _step("b", 2)
    served = store.write_transitions_behind([(a, 1, a_trail)])
    served.serve()  # the store is free: committed now, on this thread
    assert served.settled and served.errors() == [None] and _stored_version(path, "a") == 2
    store.connection.group._WAIT = 30.0  # a write that may wait is never due on its own
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
    store.create_many([_created("a")])
    a, a_trail = _step("a", 2)
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
        store.create_many([_created(name)])
    a, a_trail = _step("a", 2)
    stale, stale_trail = _step("b", 5)
    results = _queued_writes(
        store,
        [
            lambda: store.write_transitions(a, expect_version=1, transitions=a_trail),
            lambda: store.write_transitions(stale, expect_version=4, transitions=stale_trail),
            lambda: store.create_many([_created("y"), _created("x")]),  # x exists
            lambda: store.create_many([_created("z")]),
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
    store.create_many([_created(f"old{i}") for i in range(40)])
    steps = [_step(f"old{i}", 2) for i in range(40)]
    stale, stale_trail = _step("old0", 7)  # expects 6: stored is 1, then 2
    calls: list[object] = [
        lambda s=s, t=t: store.write_transitions(s, expect_version=1, transitions=t)
        for s, t in steps
    ]
    calls.append(lambda: store.write_transitions(stale, expect_version=6, transitions=stale_trail))
    calls.append(lambda: store.create_many([_created(f"new{i}") for i in range(40)]))
    direct = _into_the_tables(store)
    results = _queued_writes(store, calls)  # 40 + 1 + 40 rows
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
    store.create_many([_created("dup")])
    many = [_created(f"t{i:03}") for i in range(100)]
    with pytest.raises(TaskAlreadyExists):
        store.create_many([*many, _created("dup")])  # 202 rows, 4 statements
    assert [s.task_id for s in store.query()] == ["dup"]
    store.create_many(many)
    assert len(store.query()) == 101 and len(store.history("t099")) == 1
    with store.atomic():  # inside atomic(): on the caller's thread and transaction
        with pytest.raises(TaskAlreadyExists):
            store.create_many([_created(f"u{i:03}") for i in range(70)] + [_created("dup")])
        store.create_many([_created("v")])
    assert store.get("u000") is None and store.get("v") is not None
    store.close()


def test_writes_inside_atomic_commit_with_it_and_roll_back_with_it(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "g.db")
    with pytest.raises(RuntimeError), store.atomic():
        store.create_many([_created("gone")])
        raise RuntimeError("roll back")
    assert store.get("gone") is None
    store.close()


def test_an_old_sqlite_file_gains_the_write_view_on_open(tmp_path: Path) -> None:
    """Files made before the group commit have no ``task_writes`` view: opening adds it
    and the data stays."""
    path = tmp_path / "old.db"
    store = SqliteTaskStore(path)
    store.create_many([_created("kept")])
    store.close()
    raw = sqlite3.connect(path)
    for name in ("task_writes_new", "task_writes_life", "task_writes_trail"):
        raw.execute(f"DROP TRIGGER {name}")
    raw.execute("DROP VIEW task_writes")
    raw.commit()
    raw.close()
    store = SqliteTaskStore(path)
    store.create_many([_created("new")])
    assert {s.task_id for s in store.query()} == {"kept", "new"}
    store.close()


def test_a_write_queued_behind_a_reader_is_committed_when_the_reader_lets_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Releasing the connection serves the queue: a queued write never waits for its
    writer's retry timer (here an hour, so only the hand-over can commit it)."""
    from chongming_task.stores.sqlite import group as _sqlite_group

    monkeypatch.setattr(_sqlite_group.GroupCommit, "_RETRY", 3600.0)
    store = SqliteTaskStore(tmp_path / "g.db")
    finished = threading.Event()

    def writer() -> None:
        store.create_many([_created("queued")])
        finished.set()

    with store.connection.read("a long read"):
        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        while not store.connection.group._queue:
            finished.wait(0.001)
        assert not finished.is_set()  # queued behind us
    assert finished.wait(10), "the queued write was not committed when the lock came free"
    thread.join()
    assert store.get("queued") is not None
    store.close()


def test_the_schema_in_sqlite_sql_matches_the_codec(tmp_path: Path) -> None:
    """The statements live in stores/sqlite/schema.sql and queries.sql as SQL; the codec
    and the group commit build rows in their own column order. A column added to one and
    not the other fails here, not as a silently shifted row."""
    import re

    from chongming_task.states import TERMINAL
    from chongming_task.stores import codec
    from chongming_task.stores._sql import load_named
    from chongming_task.stores.sqlite.group import LIFE_FILLS, NEW_FILLS, WRITE_VIEW_COLUMNS

    store = SqliteTaskStore(tmp_path / "s.db")
    store.close()
    raw = sqlite3.connect(tmp_path / "s.db")
    try:

        def columns(table: str) -> tuple[str, ...]:
            return tuple(r[1] for r in raw.execute(f"PRAGMA table_info({table})"))

        # seq (schema 9) is the store's own: the codec's rows never carry it.
        assert columns("tasks") == ("seq", *codec.TASK_COLUMNS)
        # key (schema 11) is the store's own too: seq * 16777216 + version.
        assert columns("transitions") == ("key", *codec.TRANSITION_COLUMNS)
        assert columns("commands") == codec.COMMAND_COLUMNS
        assert columns("task_writes") == WRITE_VIEW_COLUMNS
        # A life row binds only LIFE_FILLS (the rest is NULL in the statement): a column
        # the trigger reads and the row leaves out would be written NULL, silently.
        (life,) = raw.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'task_writes_life'"
        ).fetchone()
        assert set(re.findall(r"NEW\.(\w+)", life)) == {"kind", *LIFE_FILLS}
        (new,) = raw.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'task_writes_new'"
        ).fetchone()
        assert set(re.findall(r"NEW\.(\w+)", new)) == {"kind", *NEW_FILLS}
    finally:
        raw.close()
    statements = load_named("chongming_task.stores.sqlite")
    claims = ("open_commands_for", "pulse_node")
    for name in ("prunable", "touch_task", "renew_lease", "write_activity", *claims):
        assert set(re.findall(r"'(\w+)'", statements[name])) == {s.value for s in TERMINAL}
    pg = load_named("chongming_task.stores.postgres")
    for name in (*claims, "notify_command"):
        assert set(re.findall(r"'(\w+)'", pg[name])) == {s.value for s in TERMINAL}
    assert statements["get_task"].split("FROM")[0].replace("\n", " ").split() == [
        "SELECT",
        *(f"{c}," for c in codec.TASK_COLUMNS[:-1]),
        codec.TASK_COLUMNS[-1],
    ]


def test_a_life_write_stores_each_transition_at_its_own_time() -> None:
    """A worker's start and end transitions share the snapshot's started_at and ended_at
    objects, and the life write encodes each of those times once: a transition at any
    other time still gets its own."""
    from datetime import timedelta

    from chongming_task.stores import codec
    from chongming_task.stores.sqlite.group import LIFE_FILLS
    from chongming_task.stores.sqlite.store import _life_request

    started = datetime(2026, 3, 1, 12, 0, 0, 1, tzinfo=UTC)
    ended = started + timedelta(seconds=2)
    between = started + timedelta(seconds=1)  # equal to neither, nor the same object
    snapshot = snap(
        "t1", status=TaskStatus.SUCCEEDED, status_version=5, started_at=started, ended_at=ended
    )
    statuses = [TaskStatus.STARTING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED]
    ats = [started, between, ended]
    transitions = [
        Transition(task_id="t1", version=v, from_status=None, to_status=to, at=at)
        for v, to, at in zip((3, 4, 5), statuses, ats, strict=True)
    ]
    request = _life_request(snapshot, 2, transitions)
    (life,) = request.life
    trail_at, life_at = codec.TRANSITION_COLUMNS.index("at"), LIFE_FILLS.index("at")
    stored = [row[trail_at] for row in request.trail] + [life[life_at]]
    assert stored == [codec.encode_dt(at) for at in ats]
    assert life[LIFE_FILLS.index("started_at")] == codec.encode_dt(started)
    assert life[LIFE_FILLS.index("ended_at")] == codec.encode_dt(ended)


def _schema_8_file(path: Path) -> sqlite3.Connection:
    """A file as a release of schema 8 made it (``data/sqlite_schema_8.sql``): tasks
    without seq, the trail keyed by (task_id, version). It holds task "kept" with its
    first transition, a trail row of a task it does not hold ("loose"), and task
    "later" made after a task that was pruned (so rowids have a gap). Open, for the
    caller to age further and commit."""
    from chongming_task.stores import codec

    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size = 1024")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript((Path(__file__).parent / "data" / "sqlite_schema_8.sql").read_text())
    columns = [c for c in codec.TASK_COLUMNS if c not in (*codec.OPTION_COLUMNS, "trace_context")]
    marks = ", ".join("?" * len(columns))
    trail_marks = ", ".join("?" * len(codec.TRANSITION_COLUMNS))
    for task_id in ("kept", "pruned", "later"):
        snapshot, created = _created(task_id)
        conn.execute(
            f"INSERT INTO tasks ({', '.join(columns)}) VALUES ({marks})",
            codec.snapshot_to_values(snapshot)[: len(columns)],
        )
        conn.execute(
            f"INSERT INTO transitions VALUES ({trail_marks})",
            codec.transition_to_values(created),
        )
    conn.execute("DELETE FROM tasks WHERE task_id = 'pruned'")
    conn.execute("DELETE FROM transitions WHERE task_id = 'pruned'")
    loose = replace(_created("loose")[1], reason="appended before its create")
    conn.execute(
        f"INSERT INTO transitions VALUES ({trail_marks})", codec.transition_to_values(loose)
    )
    conn.execute("PRAGMA user_version = 8")
    return conn


@pytest.mark.parametrize(
    ("version", "dropped"),
    [
        (
            1,
            (
                "nodes",
                "node_buckets",
                "schedules",
                "pipelines",
                "idx_commands_finished",
                "idx_tasks_owner",
            ),
        ),
        (2, ("schedules", "pipelines", "idx_commands_finished", "idx_tasks_owner")),
        (3, ("pipelines", "idx_commands_finished", "idx_tasks_owner")),
        (4, ("idx_commands_finished", "idx_tasks_owner")),
        (5, ("idx_tasks_owner",)),
        (6, ()),
        (7, ()),
        (8, ()),
    ],
)
def test_an_older_file_gains_the_new_tables_when_opened(
    tmp_path: Path, version: int, dropped: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    """Files made before node declarations (schema 1), schedule records (schema 2), ...
    or the trail keyed by seq (schema 9) are upgraded in place, their tasks and every
    trail row kept, each task keeping its place in the order tasks were made."""
    path = tmp_path / f"v{version}.db"
    conn = _schema_8_file(path)
    for name in dropped:
        kind = "INDEX" if name.startswith("idx_") else "TABLE"
        conn.execute(f"DROP {kind} {name}")
    if version < 8:  # before schema 8 the life trigger did not carry the last transition
        (life,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'task_writes_life'"
        ).fetchone()
        conn.execute("DROP TRIGGER task_writes_life")
        life = life[: life.index("INSERT OR IGNORE INTO transitions")] + "END"
        if version < 6:  # ... and before schema 6 it also wrote owner
            life = life.replace(
                "attempt = NEW.attempt,", "attempt = NEW.attempt, owner = NEW.owner,"
            )
        conn.execute(life)
    if version < 7:  # before schema 7 a new task's row did not carry its first transition
        (new,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'task_writes_new'"
        ).fetchone()
        conn.execute("DROP TRIGGER task_writes_new")
        conn.execute(new[: new.index("INSERT OR IGNORE INTO transitions")] + "END")
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()
    with caplog.at_level("WARNING", logger="chongming_task.store"):
        reopened = SqliteTaskStore(path, create=False)
    # The rebuild takes a while on a large file: it says so, once, with the count.
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: upgrading to schema {SCHEMA_VERSION}, which rebuilds the trail of its 2 "
        "tasks once "
        "(about 40 s a million tasks); other processes wait for the file"
    ]
    try:
        assert reopened.get("kept") is not None
        assert reopened.nodes() == [] and reopened.schedules() == []
        (now,) = sql(reopened).execute("PRAGMA user_version").fetchone()
        assert now == SCHEMA_VERSION == 14
        # Schema 12: what nodes say of their health, and the late reports beside tasks.
        assert "health" in [r[1] for r in sql(reopened).execute("PRAGMA table_info(nodes)")]
        assert reopened.late_reports() == []
        fresh = sqlite3.connect(":memory:")  # the copy's own settings were undone
        for pragma in ("PRAGMA cache_size", "PRAGMA secure_delete"):
            assert sql(reopened).execute(pragma).fetchone() == fresh.execute(pragma).fetchone()
        fresh.close()
        assert reopened.pipeline_records() == []
        # Each task kept its rowid as its seq; the loose trail row waits in a table of
        # its own (schema 10).
        assert sql(reopened).execute("SELECT task_id, seq FROM tasks ORDER BY seq").fetchall() == [
            ("kept", 1),
            ("later", 3),
        ]
        assert sql(reopened).execute(
            "SELECT key / 16777216, task_id, version FROM transitions"
        ).fetchall() == [(1, "kept", 1), (3, "later", 1)]
        assert sql(reopened).execute(
            "SELECT task_id, version FROM loose_transitions"
        ).fetchall() == [("loose", 1)]
        assert [t.version for t in reopened.history("kept")] == [1]
        assert [t.reason for t in reopened.history("loose")] == ["appended before its create"]
        (life,) = (
            sql(reopened)
            .execute("SELECT sql FROM sqlite_master WHERE name = 'task_writes_life'")
            .fetchone()
        )
        assert "owner" not in life and "seq" in life  # made again, as this version writes it
        reopened.create_many([_created("after")])  # its row carries its first transition
        moved, trail = _step("after", 2)
        reopened.write_transitions(moved, expect_version=1, transitions=trail)  # its last
        assert [t.version for t in reopened.history("after")] == [1, 2]
        (after,) = sql(reopened).execute("SELECT seq FROM tasks WHERE task_id = 'after'").fetchone()
        assert after == 4
        reopened.create_many([_created("loose")])  # adopts the row appended before it
        assert [t.reason for t in reopened.history("loose")] == ["appended before its create"]
        assert sql(reopened).execute("SELECT * FROM loose_transitions").fetchall() == []
        assert reopened.query(TaskQuery(owner="nobody")) == []
        for index, query in [
            ("idx_tasks_owner", "SELECT task_id FROM tasks WHERE owner = ? ORDER BY created_at"),
            ("idx_tasks_status", "SELECT task_id FROM tasks WHERE status = ?"),
            ("sqlite_autoindex_tasks", "SELECT seq FROM tasks WHERE task_id = ?"),
        ]:
            plan = " ".join(
                str(row[-1]) for row in sql(reopened).execute("EXPLAIN QUERY PLAN " + query, ["n"])
            )
            assert index in plan, plan
    finally:
        reopened.close()


def test_the_loose_trail_is_found_without_reading_every_task(tmp_path: Path) -> None:
    """The loose trail is nearly always empty, and tasks may be a million rows: each
    statement that reads it is driven by it, a lookup in tasks per loose row (planned
    the other way round, adopting after a bulk create read every task)."""
    from chongming_task.stores._sql import load_named

    statements = load_named("chongming_task.stores.sqlite")
    store = SqliteTaskStore(tmp_path / "plans.db")
    try:
        store.create_many([_created(f"t{i}") for i in range(100)])
        values = ["t1", 0, None, "queued", "2026-01-01", None, None]  # a trail row's
        arity = {"adopt_loose": 0, "adopt_loose_done": 0, "append_loose": 7, "history": 2}

        def check_plans() -> None:
            for name, taken in arity.items():
                explained = sql(store).execute(
                    f"EXPLAIN QUERY PLAN {statements[name]}", values[:taken]
                )
                plan = [str(row[-1]) for row in explained]
                for step in plan:  # tasks (alias t) only ever looked up by one id
                    if "tasks" in step or step.split()[1:2] == ["t"]:
                        assert step.startswith("SEARCH") and "(task_id=?)" in step, (name, plan)
                    assert not step.startswith("SCAN transitions"), (name, plan)

        check_plans()  # as a store plans them: no statistics
        sql(store).execute("ANALYZE")  # and after someone ran ANALYZE
        check_plans()
    finally:
        store.close()


def _seq_keyed_trail(raw: sqlite3.Connection) -> None:
    """Make a file's trail the table of schemas 9 and 10: keyed (seq, task_id, version),
    WITHOUT ROWID (the view's triggers go: the migration makes them again)."""
    for trigger in ("task_writes_new", "task_writes_life", "task_writes_trail"):
        raw.execute(f"DROP TRIGGER {trigger}")
    raw.execute(
        "CREATE TABLE old_trail (seq INTEGER NOT NULL, task_id TEXT NOT NULL, "
        "version INTEGER NOT NULL, from_status TEXT, to_status TEXT NOT NULL, at TEXT NOT "
        "NULL, reason TEXT, actor TEXT, PRIMARY KEY (seq, task_id, version)) WITHOUT ROWID"
    )
    raw.execute(
        "INSERT INTO old_trail SELECT key / 16777216, task_id, version, from_status, "
        "to_status, at, reason, actor FROM transitions"
    )
    raw.execute("DROP TABLE transitions")
    raw.execute("ALTER TABLE old_trail RENAME TO transitions")


@pytest.mark.parametrize("version", [9, 10])
def test_a_file_with_the_trail_keyed_by_seq_is_rebuilt_once(
    tmp_path: Path, version: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Schemas 9 and 10 keyed the trail by (seq, task_id, version); schema 9 also kept
    the trail of tasks not held there, under seq 0. Opening such a file rebuilds the
    trail once into the rowid table of schema 11, every row kept: a held task's under
    its key, a row of a task not held in loose_transitions."""
    from chongming_task.stores import codec

    path = tmp_path / f"v{version}.db"
    made = SqliteTaskStore(path)
    made.create_many([_created("kept"), _created("other")])
    moved, trail = _step("kept", 2)
    made.write_transitions(moved, expect_version=1, transitions=trail)
    made.close()
    raw = sqlite3.connect(path)
    _seq_keyed_trail(raw)
    loose = replace(_created("loose")[1], reason="appended before its create")
    if version == 9:
        raw.execute("DROP TABLE loose_transitions")
        raw.execute(
            "INSERT INTO transitions VALUES (0, ?, ?, ?, ?, ?, ?, ?)",
            codec.transition_to_values(loose),
        )
    else:  # schema 10's loose table, without the CHECK on versions
        raw.execute("DROP TABLE loose_transitions")
        raw.execute(
            "CREATE TABLE loose_transitions (task_id TEXT NOT NULL, version INTEGER NOT NULL, "
            "from_status TEXT, to_status TEXT NOT NULL, at TEXT NOT NULL, reason TEXT, "
            "actor TEXT, PRIMARY KEY (task_id, version)) WITHOUT ROWID"
        )
        raw.execute(
            "INSERT INTO loose_transitions VALUES (?, ?, ?, ?, ?, ?, ?)",
            codec.transition_to_values(loose),
        )
    raw.execute(f"PRAGMA user_version = {version}")
    raw.commit()
    raw.close()
    with caplog.at_level("WARNING", logger="chongming_task.store"):
        store = SqliteTaskStore(path, create=False)
    try:
        assert [r.getMessage() for r in caplog.records] == [
            f"{path}: upgrading to schema {SCHEMA_VERSION}, which rebuilds the trail of its 2 "
            "tasks once "
            "(about 40 s a million tasks); other processes wait for the file"
        ]
        assert sql(store).execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert sql(store).execute(
            "SELECT key, task_id, version FROM transitions ORDER BY key"
        ).fetchall() == [
            (16777216 + 1, "kept", 1),
            (16777216 + 2, "kept", 2),
            (2 * 16777216 + 1, "other", 1),
        ]
        assert [t.version for t in store.history("kept")] == [1, 2]
        assert [t.reason for t in store.history("loose")] == ["appended before its create"]
        for table in ("transitions", "loose_transitions"):  # both hold versions to the key
            (made,) = (
                sql(store)
                .execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,))
                .fetchone()
            )
            assert "CHECK (version BETWEEN 0 AND 16777215)" in made, made
        store.create_many([_created("loose")])
        assert [t.reason for t in store.history("loose")] == ["appended before its create"]
        assert sql(store).execute("SELECT * FROM loose_transitions").fetchall() == []
        moved, trail = _step("other", 2)
        store.write_transitions(moved, expect_version=1, transitions=trail)
        assert [t.version for t in store.history("other")] == [1, 2]
    finally:
        store.close()
    store = SqliteTaskStore(path, create=False)  # rebuilt once: the next open does nothing
    store.close()
    assert len(caplog.records) == 1


def test_the_trail_is_kept_in_the_order_tasks_were_made(tmp_path: Path) -> None:
    """Schema 9: trail rows are keyed by their task's seq first (random task ids put
    each task's rows anywhere in the tree). A trail row of a task the store does not
    hold yet waits in loose_transitions (schema 10) and joins its task when the task is
    made, by every way a task is made; a version the task brings itself is not written
    twice."""
    store = SqliteTaskStore(tmp_path / "seq.db")
    try:
        pk = sorted(
            (row[5], row[1]) for row in sql(store).execute("PRAGMA table_info(transitions)")
        )
        assert [name for order, name in pk if order] == ["key"]  # seq * 16777216 + version
        early = [
            replace(_created(task_id)[1], reason="early")
            for task_id in ("plain", "viewed", "bulk0")
        ]
        for transition in early:
            store.append(transition)
        store.append(replace(_step("viewed", 2)[1][0], reason="early"))
        assert [t.reason for t in store.history("viewed")] == ["early", "early"]
        store.create(_created("plain")[0])
        store.create_many([_created("viewed")])  # one statement through the write view
        direct = _into_the_tables(store)
        store.create_many([_created(f"bulk{i}") for i in range(70)])  # into the tables
        sql(store).set_trace_callback(None)
        assert direct
        for task_id, versions in [("plain", [1]), ("viewed", [1, 2]), ("bulk0", [1])]:
            history = store.history(task_id)
            assert [t.version for t in history] == versions
            assert {t.reason for t in history} == {"early"}
        rows = sql(store).execute("SELECT key / 16777216, task_id FROM transitions").fetchall()
        assert all(seq > 0 for seq, _ in rows), rows
        assert sql(store).execute("SELECT * FROM loose_transitions").fetchall() == []
        seqs = dict(sql(store).execute("SELECT task_id, seq FROM tasks"))
        assert sorted(seqs.values()) == list(range(1, 73))
        assert seqs["plain"] < seqs["viewed"] < seqs["bulk0"] < seqs["bulk69"]
        assert all(seqs[task_id] == seq for seq, task_id in rows)
        # Prune takes a task's trail with it; seq is the rowid by name (INTEGER PRIMARY
        # KEY), so a VACUUM after the gap renumbers nothing.
        done = snap("bulk3", status=TaskStatus.SUCCEEDED, status_version=2, attempt=1)
        finish = replace(_step("bulk3", 2)[1][0], to_status=TaskStatus.SUCCEEDED)
        store.write_transitions(done, expect_version=1, transitions=[finish])
        assert store.prune(keep_terminal=0) == 1
        assert store.history("bulk3") == []
        sql(store).execute("VACUUM")
        assert dict(sql(store).execute("SELECT task_id, seq FROM tasks"))["bulk69"] == 72
        assert [t.version for t in store.history("bulk69")] == [1]
        # A trail row appended after its task was pruned is loose again.
        store.append(_created("bulk3")[1])
        assert (
            sql(store).execute("SELECT key FROM transitions WHERE task_id = 'bulk3'").fetchall()
            == []
        )
        assert sql(store).execute("SELECT task_id, version FROM loose_transitions").fetchall() == [
            ("bulk3", 1)
        ]
        assert [t.version for t in store.history("bulk3")] == [1]
    finally:
        store.close()


def test_a_version_past_the_trail_key_fails_its_own_write_alone(tmp_path: Path) -> None:
    """The trail keys a row by seq * 16777216 + version: a version past 16777215 is
    refused with a clear error (never skipped, never written into the next task's
    range, never kept loose), and only its own caller's write fails; the rest of its
    batch lands."""
    store = SqliteTaskStore(tmp_path / "cap.db")
    try:
        store.create_many([_created("a"), _created("b")])
        a, a_trail = _step("a", 2)
        b, b_trail = _step("b", 2)
        far = [replace(t, version=16777216) for t in b_trail]
        results = _queued_writes(
            store,
            [
                lambda: store.write_transitions(a, expect_version=1, transitions=a_trail),
                lambda: store.write_transitions(b, expect_version=1, transitions=far),
            ],
        )
        assert results[0] is None
        assert isinstance(results[1], StoreError) and "16777215" in str(results[1])
        assert store.get("a") == a
        assert store.get("b").status_version == 1  # nothing of the refused write landed
        assert [t.version for t in store.history("b")] == [1]
        with pytest.raises(StoreError):
            store.append(far[0])
        assert [t.version for t in store.history("b")] == [1]
        # Nor does the loose trail take one (it could never join its task).
        with pytest.raises(StoreError):
            store.append(replace(_created("ghost")[1], version=16777216))
        assert sql(store).execute("SELECT * FROM loose_transitions").fetchall() == []
    finally:
        store.close()


def test_a_create_after_adopting_a_later_version_keys_its_own_under_its_seq(
    tmp_path: Path,
) -> None:
    """Through the write view a create adopts its task's loose rows, then writes its own
    first transition; an adopted row moves last_insert_rowid() off the task's seq, so the
    trigger looks the seq up: the first transition lands under the task's key, beside
    the adopted one, and the next task's trail is untouched."""
    store = SqliteTaskStore(tmp_path / "adopt.db")
    try:
        store.create_many([_created("before")])
        store.append(replace(_step("gap", 2)[1][0], reason="early"))
        store.create_many([_created("gap")])  # one statement through the write view
        store.create_many([_created("after")])
        keys = (
            sql(store)
            .execute("SELECT key / 16777216, key % 16777216, task_id FROM transitions ORDER BY key")
            .fetchall()
        )
        assert keys == [(1, 1, "before"), (2, 1, "gap"), (2, 2, "gap"), (3, 1, "after")]
        assert [(t.version, t.reason) for t in store.history("gap")] == [(1, None), (2, "early")]
    finally:
        store.close()


@pytest.mark.parametrize("filler", [0, 70], ids=["one statement", "into the tables"])
def test_a_trail_row_of_a_task_not_held_is_loose_by_every_write(
    tmp_path: Path, filler: int
) -> None:
    """A write may carry another task's transition (a caller hands one over): through
    the write view and straight into the tables alike, a row of a task the store does
    not hold is loose, one of a task it holds goes under that task's seq, and a
    version already there is written neither again nor loose."""
    store = SqliteTaskStore(tmp_path / "loose.db")
    try:
        store.create_many([_created("held"), *[_created(f"f{i}") for i in range(filler)]])
        moved, trail = _step("held", 2)
        elsewhere = [
            replace(_created("unborn")[1], reason="handed over"),
            replace(_created("held")[1], reason="again"),  # v1 is there already
        ]
        fillers = [_step(f"f{i}", 2) for i in range(filler)]
        store.write_transitions_together(
            [(moved, 1, [*elsewhere, *trail]), *[(s, 1, t) for s, t in fillers]]
        )
        assert [(t.version, t.reason) for t in store.history("held")] == [(1, None), (2, "to v2")]
        assert sql(store).execute(
            "SELECT task_id, version, reason FROM loose_transitions"
        ).fetchall() == [("unborn", 1, "handed over")]
        assert [t.reason for t in store.history("unborn")] == ["handed over"]
        store.create_many([_created("unborn")])  # adopts it: its own v1 is not written
        assert [t.reason for t in store.history("unborn")] == ["handed over"]
        assert sql(store).execute("SELECT COUNT(*) FROM loose_transitions").fetchone() == (0,)
    finally:
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
    bad_snapshot, bad_created = _created("bad")
    bad = (replace(bad_snapshot, name="not \udcff utf-8"), bad_created)
    try:
        direct = _into_the_tables(store)
        results = _queued_writes(
            store,
            [
                lambda: store.create_many([_created("a")]),
                lambda: store.create_many([_created(f"f{i}") for i in range(filler)]),
                lambda: store.create_many([bad]),
                lambda: store.create_many([_created("b")]),
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


def test_a_none_is_bound_as_null_through_the_registered_adapter(tmp_path: Path) -> None:
    """The store registers an adapter for None (sqlite3 formats an exception it throws
    away for each None it finds none for): a None column still lands as NULL."""
    import chongming_task.stores.sqlite.group  # noqa: F401  (registers it)

    assert sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)](None) is None
    store = SqliteTaskStore(tmp_path / "s.db")
    store.create_many([_created("n1")])
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


@pytest.mark.parametrize("many", [1, 70], ids=["one statement", "into the tables"])
def test_a_create_whose_transition_is_another_tasks_appends_it_there(
    tmp_path: Path, many: int
) -> None:
    """A new task's row carries its own first transition; one handed over for another
    task is appended to that task's trail, as ``append`` would."""
    store = SqliteTaskStore(tmp_path / "c.db")
    store.create_many([_created("other")])
    made = [_created(f"t{i}") for i in range(many)]
    _, foreign = _created("other")
    foreign = replace(foreign, version=2, reason="handed over")
    direct = _into_the_tables(store)
    store.create_many([*made, (snap("odd"), foreign)])
    sql(store).set_trace_callback(None)
    assert bool(direct) == (many > 1), direct
    assert [t.reason for t in store.history("other")] == [None, "handed over"]
    assert store.history("odd") == [] and store.get("odd") == snap("odd")
    assert all(store.history(s.task_id) == [t] for s, t in made)
    store.close()


@pytest.mark.parametrize("filler", [0, 70], ids=["one statement", "into the tables"])
def test_a_compare_and_set_carries_its_last_transition_and_the_others_follow(
    tmp_path: Path, filler: int
) -> None:
    """A life row carries the write's last transition (schema 8); the earlier ones are
    trail rows of their own, a write without any leaves the trail alone, and a last one
    of another task is appended there."""
    store = SqliteTaskStore(tmp_path / "l.db")
    store.create_many([_created(name) for name in ("a", "b", "c", "other")])
    steps = [_step("a", v)[1][0] for v in (2, 3, 4)]
    moved_a = snap("a", status=TaskStatus.RUNNING, status_version=4, attempt=1)
    saved_b = snap("b", status=TaskStatus.RUNNING, status_version=2)
    foreign = replace(steps[0], task_id="other", reason="handed over")
    moved_c = snap("c", status=TaskStatus.RUNNING, status_version=2)
    calls: list[object] = [
        lambda: store.create_many([_created(f"f{i}") for i in range(filler)]),
        lambda: store.write_transitions(moved_a, expect_version=1, transitions=steps),
        lambda: store.write_transitions(saved_b, expect_version=1, transitions=()),
        lambda: store.write_transitions(moved_c, expect_version=1, transitions=[foreign]),
    ]
    direct = _into_the_tables(store)
    assert _queued_writes(store, calls) == [None] * 4
    sql(store).set_trace_callback(None)
    assert bool(direct) == bool(filler), direct
    assert store.get("a") == moved_a
    assert [t.reason for t in store.history("a")] == [None, "to v2", "to v3", "to v4"]
    assert store.get("b") == saved_b and [t.version for t in store.history("b")] == [1]
    assert store.get("c") == moved_c and [t.version for t in store.history("c")] == [1]
    assert [t.reason for t in store.history("other")] == [None, "handed over"]
    store.close()


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
