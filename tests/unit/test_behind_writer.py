"""On a store that queues writes without waiting for them (``BatchedWrites``:
SQLite), a node's workers write their runs' starts and ends themselves and never wait
(``BehindWriter``). What must hold, as with the threaded writer (``test_writer.py``,
whose tests of held writes and control calls run on both): ``wait()`` returns only once
the end is in the store; a control call returns only once its transition is; every
transition reaches the trail in order; one write's conflict or failure costs the others
nothing. And what is new: a quick task's start and end are one write; a task that runs
on has its start written while it runs; the writes ride other callers' commits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    SqliteTaskStore,
    StoreError,
    TaskDefinition,
    TaskRun,
    TaskStatus,
)
from chongming_task.run.writers import BehindWriter
from chongming_task.stores.roles import LifeWrite, PendingWrites
from tests.conftest import here, wait_until

Make = Callable[..., Controller]
S = TaskStatus
LIFE = [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]


class Recorded(SqliteTaskStore):
    """Records the task ids of each ``write_transitions_behind`` call."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls: list[list[str]] = []

    def write_transitions_behind(self, writes: Sequence[LifeWrite]) -> Any:
        self.calls.append([snapshot.task_id for snapshot, _, _ in writes])
        return super().write_transitions_behind(writes)


class _Held:
    """Writes a ``Held`` store keeps back: written (together, on a thread of their own)
    once the store's ``release`` is set, and settled only then."""

    def __init__(self, store: Held, writes: Sequence[LifeWrite]) -> None:
        self.queued_at = time.monotonic()
        self._errors: list[BaseException | None] | None = None
        self._thread = threading.Thread(target=self._write, args=(store, writes))
        self._thread.start()

    def _write(self, store: Held, writes: Sequence[LifeWrite]) -> None:
        store.release.wait(10)  # a test that failed first never hangs its teardown
        self._errors = store.write_transitions_together(writes)

    @property
    def settled(self) -> bool:
        return self._errors is not None

    def errors(self) -> list[BaseException | None]:
        assert self._errors is not None
        return list(self._errors)

    def serve(self) -> None:
        pass

    def wait(self) -> None:
        self._thread.join(10)


class Held(Recorded):
    """Holds every queued write (of the task named ``hold``, if given) until
    ``release`` is set: nothing of it is committed, and it is not settled, till then."""

    def __init__(self, path: Path, hold: str | None = None) -> None:
        super().__init__(path)
        self.holding = threading.Event()  # a write is being held
        self.release = threading.Event()
        self._hold = hold

    def write_transitions_behind(self, writes: Sequence[LifeWrite]) -> Any:
        if self.release.is_set() or (
            self._hold is not None and all(s.name != self._hold for s, _, _ in writes)
        ):
            return super().write_transitions_behind(writes)
        self.calls.append([snapshot.task_id for snapshot, _, _ in writes])
        self.holding.set()
        held: PendingWrites = _Held(self, writes)
        return held


def stored_life(store: SqliteTaskStore, task_id: str) -> list[S]:
    return [t.to_status for t in store.history(task_id)]


def conflict_tasks(
    c: Controller, outsider: SqliteTaskStore, gated: threading.Event
) -> tuple[TaskDefinition, TaskDefinition, TaskDefinition]:
    """The conflict tests' tasks (both writers'): ``gate`` sets ``gated`` (its write is
    the one a ``Held`` store holds), ``moved`` is moved in the store by ``outsider``
    while it runs, ``next`` returns 7."""

    @c.task(name="gate")
    def hold(token: CancellationToken) -> None:
        gated.set()

    @c.task(name="moved")
    def moved(token: CancellationToken) -> None:
        stored = outsider.get(here().task_id)
        assert stored is not None
        outsider.save(
            replace(stored, status_version=stored.status_version + 1),
            expect_version=stored.status_version,
        )

    @c.task(name="next")
    def step(token: CancellationToken) -> int:
        return 7

    return hold, moved, step


def assert_only_the_moved_task_desynced(
    c: Controller, store: SqliteTaskStore, moved: TaskRun, beside: TaskRun
) -> None:
    """``moved``'s write conflicted: desynced, and the store keeps the outsider's
    version; ``beside``, written with it, landed whole."""
    assert c.desynced_tasks == frozenset({moved.task_id})
    stored_a = store.get(moved.task_id)
    assert stored_a is not None and stored_a.status is S.QUEUED  # never overwritten
    assert stored_a.status_version == 2  # the outsider's
    assert stored_life(store, moved.task_id) == [S.QUEUED]
    stored_b = store.get(beside.task_id)
    assert stored_b is not None and stored_b.status is S.SUCCEEDED
    assert stored_life(store, beside.task_id) == LIFE


def test_a_quick_tasks_start_and_end_are_one_write(
    tmp_path: Path, make_controller: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No start is handed over (its function ends first): each task's whole life is
    one queued write (how they ride other commits: ``test_sqlite_group.py``)."""
    monkeypatch.setattr(BehindWriter, "HAND_OVER", 30.0)
    store = Recorded(tmp_path / "t.db")
    c = make_controller(store, max_workers=4)
    assert isinstance(c._services.writer, BehindWriter)
    job = c.task(lambda token, n: n, name="echo")
    runs = [c.submit(job, n) for n in range(200)]
    for n, run in enumerate(runs):
        final = run.wait(10)
        assert final.status is S.SUCCEEDED and final.outcome == n
        stored = store.get(run.task_id)  # read at once: the end is already there
        assert stored is not None and stored.status is S.SUCCEEDED and stored.outcome == n
        assert stored.status_version == final.status_version
        assert stored_life(store, run.task_id) == LIFE
    assert sorted(task for call in store.calls for task in call) == sorted(
        run.task_id for run in runs
    )  # one write a task, start and end together
    assert not c.desynced_tasks and all(run.written for run in runs)


def test_a_task_that_runs_on_has_its_start_written_meanwhile(
    tmp_path: Path, make_controller: Make
) -> None:
    store = SqliteTaskStore(tmp_path / "t.db")
    reader = SqliteTaskStore(tmp_path / "t.db")
    c = make_controller(store, max_workers=2)
    go = threading.Event()

    @c.task(name="long")
    def long(token: CancellationToken) -> str:
        assert go.wait(10)
        return "done"

    run = c.submit(long)

    def running() -> bool:
        stored = reader.get(run.task_id)
        return stored is not None and stored.status is S.RUNNING

    wait_until(running, what="the start in the store while the function runs")
    assert stored_life(reader, run.task_id) == [S.QUEUED, S.STARTING, S.RUNNING]
    assert not run.done()
    go.set()
    assert run.wait(10).outcome == "done"
    assert stored_life(reader, run.task_id) == LIFE
    reader.close()


def test_a_conflict_costs_the_other_writes_nothing(
    tmp_path: Path, make_controller: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer moves a task in the store while it runs: its write conflicts (the
    task is desynced, never overwritten) and the writes beside it land."""
    monkeypatch.setattr(BehindWriter, "HAND_OVER", 30.0)  # the outsider's save comes first
    store = Held(tmp_path / "t.db", hold="gate")
    c = make_controller(store, max_workers=3)
    outsider = SqliteTaskStore(tmp_path / "t.db")
    gated = threading.Event()
    hold, moved, step = conflict_tasks(c, outsider, gated)

    first = c.submit(hold)
    assert gated.wait(5) and store.holding.wait(5)
    a = c.submit(moved)
    b = c.submit(step)
    assert b.wait(10).outcome == 7
    a.wait(10)  # the store's word now (the outsider's), not the run's
    assert a.snapshot().status is S.SUCCEEDED  # what the process saw
    store.release.set()
    assert first.wait(10).status is S.SUCCEEDED
    assert_only_the_moved_task_desynced(c, store, a, b)
    assert stored_life(store, first.task_id) == LIFE
    outsider.close()


def test_a_write_the_store_will_not_queue_is_written_alone(
    tmp_path: Path, make_controller: Make
) -> None:
    """A store whose ``write_transitions_behind`` raises for a call (breaking its
    contract, or a value it cannot encode): that write is made alone, on the worker,
    and no task waits for a catch-up because of it."""

    class Refusing(Recorded):
        def write_transitions_behind(self, writes: Sequence[LifeWrite]) -> Any:
            self.calls.append([snapshot.task_id for snapshot, _, _ in writes])
            raise StoreError("refused as a whole")

    store = Refusing(tmp_path / "t.db")
    c = make_controller(store, max_workers=4)
    echo = c.task(lambda token, n: n, name="echo")
    runs = [c.submit(echo, n) for n in range(20)]
    for n, run in enumerate(runs):
        assert run.wait(10).outcome == n
        stored = store.get(run.task_id)
        assert stored is not None and stored.status is S.SUCCEEDED
        assert stored_life(store, run.task_id) == LIFE
    assert store.calls  # tried behind first
    assert not c.desynced_tasks and all(run.written for run in runs)


def test_writes_no_commit_carried_are_committed_by_the_writers_thread(
    tmp_path: Path, make_controller: Make
) -> None:
    """No worker commits its own write and no caller comes: the writer's thread commits
    them (past ``HAND_OVER``) and ends their runs."""
    store = SqliteTaskStore(tmp_path / "t.db")
    store.connection.group.WAIT = 30.0  # no release of the store's lock commits them early either
    c = make_controller(store, max_workers=4)
    assert isinstance(c._services.writer, BehindWriter)
    c._services.writer._backlog = lambda: True  # a worker always leaves its write to ride
    noop = c.task(lambda token: None, name="noop")
    runs = c.submit_many(noop, [()] * 50)
    for run in runs:
        assert run.wait(10).status is S.SUCCEEDED
        assert stored_life(store, run.task_id) == LIFE


def test_stopping_the_writer_sees_every_pending_write_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes nobody's commit carried (the thread never looks on its own here) are
    committed, and their runs ended, when the writer stops: what the process says is
    what is stored."""
    monkeypatch.setattr(BehindWriter, "TICK", 30.0)
    store = SqliteTaskStore(tmp_path / "t.db")
    store.connection.group.WAIT = 30.0
    c = Controller(store, max_workers=4)
    writer = c._services.writer
    assert isinstance(writer, BehindWriter)
    writer._backlog = lambda: True
    noop = c.task(lambda token: None, name="noop")
    runs = c.submit_many(noop, [()] * 50)
    wait_until(lambda: all(run.status is S.SUCCEEDED for run in runs))
    writer.stop()
    writer.join(10)
    assert not writer.pending
    for run in runs:
        run.wait(10)  # a worker still writing when the writer stopped writes itself
        stored = store.get(run.task_id)
        assert stored is not None and stored.status is S.SUCCEEDED
        assert stored_life(store, run.task_id) == LIFE
    c.close(timeout=10)
    store.close()
