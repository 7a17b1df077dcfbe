"""PostgreSQL group commit against a real server: concurrent write-through writes share a
statement, and one caller's fault (a conflict, an existing id, a value the server
refuses) costs no other caller anything.

A batch is made deterministic by holding a row lock from another connection: the
leaders' statements wait on it, every other writer queues meanwhile, and once the lock
goes the next statement carries all of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from chongming_task import (
    ConcurrencyConflict,
    StoreError,
    TaskAlreadyExists,
    TaskSnapshot,
    TaskStatus,
)
from chongming_task.model import Progress, Transition
from tests.conftest import wait_until
from tests.integration.postgres_support import drop_schemas, new_schema, require_dsn

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def tr(
    task_id: str,
    version: int,
    was: TaskStatus | None,
    now: TaskStatus,
    at: datetime,
    reason: str | None = None,
    actor: str | None = None,
) -> Transition:
    return Transition(
        task_id=task_id,
        version=version,
        from_status=was,
        to_status=now,
        at=at,
        reason=reason,
        actor=actor,
    )


@pytest.fixture
def store() -> Iterator[object]:
    from chongming_task.stores.postgres import PostgresTaskStore

    dsn = require_dsn()
    schema = new_schema()
    made = PostgresTaskStore(dsn, schema=schema, max_size=12, application_name="group-test")
    made.create_schema()
    yield made
    made.close()
    drop_schemas(dsn, [schema])


def queued(task_id: str) -> tuple[TaskSnapshot, Transition]:
    snap = TaskSnapshot(
        task_id=task_id, name="job", status=TaskStatus.QUEUED, status_version=1, created_at=T0
    )
    return snap, tr(task_id, 1, None, TaskStatus.QUEUED, T0, "submitted", "test")


def started(task_id: str, **changes: object) -> tuple[TaskSnapshot, list[Transition]]:
    snap, _ = queued(task_id)
    at = T0 + timedelta(seconds=1)
    running = snap.evolve(status=TaskStatus.RUNNING, status_version=3, attempt=1, started_at=at)
    running = running.evolve(**changes) if changes else running
    trail = [
        tr(task_id, 2, TaskStatus.QUEUED, TaskStatus.STARTING, at, "attempt 1", "t"),
        tr(task_id, 3, TaskStatus.STARTING, TaskStatus.RUNNING, at, None, "t"),
    ]
    return running, trail


class Statements:
    """Counts the group-commit statements a store runs (``group.on_batch``) and
    the writes each carried."""

    def __init__(self, store: object, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[list[str]] = []

        def counted(writes: list[object]) -> None:
            self.batches.append([w.task_id for w in writes])  # type: ignore[attr-defined]

        monkeypatch.setattr(store.group, "on_batch", counted)  # type: ignore[attr-defined]


def blocked_rows(dsn: str, schema: str, task_ids: list[str]) -> tuple[object, Callable[[], None]]:
    """Lock ``task_ids``'s rows from another connection; returns a release function."""
    import psycopg

    conn = psycopg.connect(dsn, options=f"-c search_path={schema}")
    conn.execute("SELECT 1 FROM tasks WHERE task_id = ANY(%s) FOR UPDATE", [task_ids])

    def release() -> None:
        conn.rollback()
        conn.close()

    return conn, release


def waiting_on_locks(dsn: str, count: int) -> None:
    """Wait until ``count`` backends of the store wait on a row lock."""
    import psycopg

    deadline = time.monotonic() + 10
    with psycopg.connect(dsn, autocommit=True) as admin:
        while time.monotonic() < deadline:
            (n,) = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'group-test' "
                "AND wait_event_type = 'Lock'"
            ).fetchone() or (0,)
            if n >= count:
                return
            time.sleep(0.01)
    raise AssertionError(f"{count} leaders never waited on the held rows")


class Calls:
    """Each call on its own thread, started in order; ``outcome()`` joins them and says
    what each raised (``None``: it returned)."""

    def __init__(self, calls: dict[str, Callable[[], None]]) -> None:
        self._outcome: dict[str, BaseException | None] = {}
        self._threads = [
            threading.Thread(target=self._one, args=item, daemon=True) for item in calls.items()
        ]
        for thread in self._threads:
            thread.start()
            time.sleep(0.005)  # queue in this order

    def _one(self, key: str, call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:
            self._outcome[key] = exc
        else:
            self._outcome[key] = None

    def outcome(self) -> dict[str, BaseException | None]:
        for thread in self._threads:
            thread.join(10)
        assert not any(t.is_alive() for t in self._threads), "a writer never returned"
        return self._outcome


def test_writes_queued_behind_a_statement_share_the_next_one(
    store: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = require_dsn()
    ids = [f"t{i}" for i in range(12)]
    for task_id in ids:
        store.create_many([queued(task_id)])  # type: ignore[attr-defined]
    statements = Statements(store, monkeypatch)
    _, release = blocked_rows(dsn, store.schema, ids[:2])  # type: ignore[attr-defined]

    def start(task_id: str) -> Callable[[], None]:
        snap, trail = started(task_id)
        return lambda: store.write_transitions(snap, expect_version=1, transitions=trail)  # type: ignore[attr-defined]

    leaders = Calls({ids[0]: start(ids[0]), ids[1]: start(ids[1])})
    waiting_on_locks(dsn, 2)  # both leaders' statements wait on the held rows
    rest = Calls({task_id: start(task_id) for task_id in ids[2:]})
    wait_until(lambda: store.group.queued == len(ids) - 2, what="the others queued")  # type: ignore[attr-defined]
    assert statements.batches == [[ids[0]], [ids[1]]]
    release()
    outcome = leaders.outcome() | rest.outcome()
    assert outcome == dict.fromkeys(ids)
    # The ten queued writes went in at most two statements (one per leader handing over).
    assert len(statements.batches) <= 4
    assert sorted(t for batch in statements.batches for t in batch) == sorted(ids)
    for task_id in ids:
        assert store.get(task_id).status is TaskStatus.RUNNING  # type: ignore[attr-defined]
        assert [t.version for t in store.history(task_id)] == [1, 2, 3]  # type: ignore[attr-defined]


def test_one_callers_fault_in_a_batch_costs_the_others_nothing(
    store: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = require_dsn()
    for task_id in ("block-a", "block-b", "exists", "moved", "good-life", "bad-life"):
        store.create_many([queued(task_id)])  # type: ignore[attr-defined]
    moved, moved_trail = started("moved")
    store.write_transitions(moved, expect_version=1, transitions=moved_trail)  # type: ignore[attr-defined]
    statements = Statements(store, monkeypatch)
    _, release = blocked_rows(dsn, store.schema, ["block-a", "block-b"])  # type: ignore[attr-defined]

    def life(task_id: str, expect: int, **changes: object) -> Callable[[], None]:
        snap, trail = started(task_id, **changes)
        return lambda: store.write_transitions(snap, expect_version=expect, transitions=trail)  # type: ignore[attr-defined]

    def create(task_id: str) -> Callable[[], None]:
        return lambda: store.create_many([queued(task_id)])  # type: ignore[attr-defined]

    leaders = Calls({"block-a": life("block-a", 1), "block-b": life("block-b", 1)})
    waiting_on_locks(dsn, 2)
    # A value the server refuses: text with NUL, which the runtime's boundary checks
    # keep out (values.STRICT); handed to the store directly here, it fails the statement.
    bad = Progress(current=1, total=2, message="nul \x00 inside")
    calls = Calls(
        {
            "new-one": create("new-one"),
            "exists": create("exists"),
            "moved": life("moved", 1),  # stored at version 3: this caller expects 1
            "good-life": life("good-life", 1),
            "bad-life": life("bad-life", 1, progress=bad),
            "new-two": create("new-two"),
        }
    )
    wait_until(lambda: store.group.queued == 6, what="the six queued")  # type: ignore[attr-defined]
    release()
    assert leaders.outcome() == {"block-a": None, "block-b": None}
    rest = calls.outcome()
    assert any(len(batch) > 2 for batch in statements.batches), statements.batches
    assert rest["new-one"] is None and rest["new-two"] is None and rest["good-life"] is None
    assert isinstance(rest["exists"], TaskAlreadyExists)
    assert isinstance(rest["moved"], ConcurrencyConflict)
    assert "expected version 1, stored version 3" in str(rest["moved"])
    assert isinstance(rest["bad-life"], StoreError)
    assert not isinstance(rest["bad-life"], ConcurrencyConflict)
    # The winners are written with their trails; the losers wrote nothing.
    for task_id in ("new-one", "new-two"):
        assert [t.version for t in store.history(task_id)] == [1]  # type: ignore[attr-defined]
    assert store.get("good-life").status is TaskStatus.RUNNING  # type: ignore[attr-defined]
    assert [t.version for t in store.history("good-life")] == [1, 2, 3]  # type: ignore[attr-defined]
    assert [t.version for t in store.history("exists")] == [1]  # type: ignore[attr-defined]
    assert store.get("bad-life").status is TaskStatus.QUEUED  # type: ignore[attr-defined]
    assert [t.version for t in store.history("bad-life")] == [1]  # type: ignore[attr-defined]
    assert [t.reason for t in store.history("moved")] == ["submitted", "attempt 1", None]  # type: ignore[attr-defined]


def test_a_write_inside_atomic_is_the_callers_transaction(store: object) -> None:
    store.create_many([queued("a")])  # type: ignore[attr-defined]
    snap, trail = started("a")

    class Undo(Exception):
        pass

    with pytest.raises(Undo), store.atomic():  # type: ignore[attr-defined]
        store.write_transitions(snap, expect_version=1, transitions=trail)  # type: ignore[attr-defined]
        store.create_many([queued("b")])  # type: ignore[attr-defined]
        assert store.get("a").status is TaskStatus.RUNNING  # type: ignore[attr-defined]
        raise Undo
    assert store.get("a").status is TaskStatus.QUEUED  # type: ignore[attr-defined]
    assert store.get("b") is None  # type: ignore[attr-defined]
    assert [t.version for t in store.history("a")] == [1]  # type: ignore[attr-defined]


def test_many_threads_writing_many_tasks_lose_nothing(store: object) -> None:
    """Sixteen threads, each a task's whole life (create, start, end), at once."""
    errors: list[BaseException] = []

    def life(n: int) -> None:
        try:
            for k in range(20):
                task_id = f"w{n}-{k}"
                store.create_many([queued(task_id)])  # type: ignore[attr-defined]
                snap, trail = started(task_id)
                store.write_transitions(snap, expect_version=1, transitions=trail)  # type: ignore[attr-defined]
                end = snap.evolve(status=TaskStatus.SUCCEEDED, status_version=4, ended_at=T0)
                done = tr(task_id, 4, TaskStatus.RUNNING, TaskStatus.SUCCEEDED, T0)
                store.write_transitions(end, expect_version=3, transitions=[done])  # type: ignore[attr-defined]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=life, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    counts = store.counts()  # type: ignore[attr-defined]
    assert counts == {TaskStatus.SUCCEEDED: 320}
    for n in (0, 7, 15):
        assert [t.version for t in store.history(f"w{n}-19")] == [1, 2, 3, 4]  # type: ignore[attr-defined]


def test_a_lone_compare_and_set_that_loses_says_what_it_found(store: object) -> None:
    """A batch of compare-and-sets alone takes the per-row form: its outcome too."""
    for task_id in ("a", "b"):
        store.create_many([queued(task_id)])  # type: ignore[attr-defined]
        snap, trail = started(task_id)
        store.write_transitions(snap, expect_version=1, transitions=trail)  # type: ignore[attr-defined]
    stale, trail = started("a")
    with pytest.raises(ConcurrencyConflict, match="expected version 1, stored version 3"):
        store.write_transitions(stale, expect_version=1, transitions=trail)  # type: ignore[attr-defined]
    ghost, trail = started("ghost")
    with pytest.raises(ConcurrencyConflict, match="expected version 1, stored nothing"):
        store.write_transitions(ghost, expect_version=1, transitions=trail)  # type: ignore[attr-defined]
    assert [t.version for t in store.history("a")] == [1, 2, 3]  # type: ignore[attr-defined]
    assert store.history("ghost") == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("size", [1, 2, 4, 5, 8, 9, 40])
def test_every_statement_shape_writes_each_row_with_its_trail(store: object, size: int) -> None:
    """One statement per shape (one caller's writes, one batch), run as it is sent (server
    placeholders, no driver parsing): compare-and-sets alone (the per-row form up to
    eight, JSON rows beyond), mixed with new tasks, new tasks alone, and one that
    loses in each."""
    from chongming_task.stores.postgres.group import GroupWrite

    ids = [f"s{size}-{k}" for k in range(size)]
    for task_id in ids:
        store.create_many([queued(task_id)])  # type: ignore[attr-defined]
    statements: list[int] = []  # the writes each statement carried
    store.group.on_batch = lambda batch: statements.append(len(batch))  # type: ignore[attr-defined]
    writes = []
    for k, task_id in enumerate(ids):
        snap, trail = started(task_id, progress=Progress(current=k, total=size))
        writes.append(GroupWrite(task_id, trail, life=snap, expect=1 if k else 2))
    store.group.run(writes)  # type: ignore[attr-defined]
    assert isinstance(writes[0].error, ConcurrencyConflict)  # expected 2, stored 1
    assert "expected version 2, stored version 1" in str(writes[0].error)
    assert all(w.error is None for w in writes[1:])
    assert [t.version for t in store.history(ids[0])] == [1]  # type: ignore[attr-defined]
    for k, task_id in enumerate(ids[1:], 1):
        stored = store.get(task_id)  # type: ignore[attr-defined]
        assert (stored.status, stored.progress.current) == (TaskStatus.RUNNING, k)
        assert [t.version for t in store.history(task_id)] == [1, 2, 3]  # type: ignore[attr-defined]

    def create(task_id: str) -> GroupWrite:
        snap, created = queued(task_id)
        return GroupWrite(task_id, [created], new=snap)

    new = [create(f"n{size}-{k}") for k in range(size)]
    snap, trail = started(ids[0])
    mixed = [*new, GroupWrite(ids[0], trail, life=snap, expect=1)]
    store.group.run(mixed)  # type: ignore[attr-defined]
    assert all(w.error is None for w in mixed)
    assert store.get(ids[0]).status is TaskStatus.RUNNING  # type: ignore[attr-defined]
    again = [create(w.task_id) for w in new]
    store.group.run(again)  # type: ignore[attr-defined]
    assert all(isinstance(w.error, TaskAlreadyExists) for w in again)
    for w in new:
        assert [t.version for t in store.history(w.task_id)] == [1]  # type: ignore[attr-defined]
    assert statements == [size, size + 1, size]  # each shape one statement, losers inside


def test_a_nodes_ends_ride_the_submits_statements_and_are_stored_when_told(
    store: object,
) -> None:
    """A loop of ``submit`` while the workers run: each run's start and end are queued
    behind (no thread waits on them) and ride a statement a submit leads, so the
    statements number fewer than the writes; every ``wait()`` returns with the end
    already in the store, read over another connection."""
    from chongming_task import Controller
    from chongming_task.run.writers import BehindWriter
    from chongming_task.stores.postgres import PostgresTaskStore
    from chongming_task.stores.postgres.group import GroupWrite

    assert isinstance(store, PostgresTaskStore)
    statements: list[tuple[int, int]] = []  # (new tasks, life writes) of each

    def counted(writes: Sequence[GroupWrite]) -> None:
        new = sum(1 for w in writes if w.new is not None)
        statements.append((new, len(writes) - new))

    store.group.on_batch = counted
    reader = PostgresTaskStore(require_dsn(), schema=store.schema)
    node = Controller(store, max_workers=2)
    try:
        assert isinstance(node._services.writer, BehindWriter)
        echo = node.task(lambda token, n: n, name="echo")
        runs = [node.submit(echo, n) for n in range(200)]
        for n, run in enumerate(runs):
            final = run.wait(30)
            stored = reader.get(run.task_id)
            assert stored is not None and stored.status is TaskStatus.SUCCEEDED
            assert stored.outcome == n and stored.status_version == final.status_version
            assert [t.to_status for t in reader.history(run.task_id)] == [
                TaskStatus.QUEUED,
                TaskStatus.STARTING,
                TaskStatus.RUNNING,
                TaskStatus.SUCCEEDED,
            ]
    finally:
        node.close()
        reader.close()
    ends = sum(life for _, life in statements)
    assert sum(new for new, _ in statements) == 200 and ends >= 200
    assert any(new and life for new, life in statements), "no end rode a submit's statement"
    assert len(statements) < 200 + ends  # statements carried more than one write
