"""On a store that commits side-by-side writes together (``group_commit``), a worker whose
next run is waiting keeps its run's end unwritten and writes it beside that run's start:
one store call (``write_transitions_together``), one statement. What must not change:
``wait()`` returns only once the end is in the store, the run's slot is freed only then,
``close()`` leaves nothing unwritten, and one write's conflict never costs the other
write of the pair anything. A store without group commit writes each end alone."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from chongming_task import (
    CancellationToken,
    Controller,
    InMemoryTaskStore,
    SqliteTaskStore,
    TaskStatus,
)

Make = Callable[..., Controller]
LIFE = [TaskStatus.QUEUED, TaskStatus.STARTING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED]


class Together:
    """Records the task ids of each ``write_transitions_together`` call."""

    calls: list[list[str]]

    def write_transitions_together(self, writes: Sequence[Any]) -> list[BaseException | None]:
        self.calls.append([snapshot.task_id for snapshot, _, _ in writes])
        return super().write_transitions_together(writes)  # type: ignore[misc, no-any-return]


class CountingSqlite(Together, SqliteTaskStore):
    def __init__(self, path: Path) -> None:
        self.calls = []
        super().__init__(path)


def test_wait_returns_once_the_end_is_stored_and_nothing_is_lost(
    tmp_path: Path, make_controller: Make
) -> None:
    store = CountingSqlite(tmp_path / "t.db")
    c = make_controller(store, max_workers=4)
    assert c.capabilities.group_commit

    @c.task(name="double")
    def double(token: CancellationToken, n: int) -> int:
        return 2 * n

    gate = threading.Event()

    @c.task(name="gate")
    def hold(token: CancellationToken) -> None:
        gate.wait(10)

    gates = [c.submit(hold) for _ in range(4)]  # every worker busy: the runs queue up
    runs = [c.submit(double, n) for n in range(300)]
    gate.set()
    for g in gates:
        g.wait(10)
    for n, run in enumerate(runs):
        final = run.wait(10)
        assert final.status is TaskStatus.SUCCEEDED and final.outcome == 2 * n
        stored = store.get(run.task_id)  # read at once: the end is already there
        assert stored is not None and stored.status is TaskStatus.SUCCEEDED
        assert stored.outcome == 2 * n
    assert store.calls, "with runs waiting, no end was written beside the next start"
    for run in runs[::37]:
        assert [t.to_status for t in store.history(run.task_id)] == LIFE


def test_close_leaves_no_end_unwritten(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "t.db")
    c = Controller(store, max_workers=4)
    noop = c.task(lambda token: None, name="noop")
    runs = [c.submit(noop) for _ in range(200)]
    c.close(timeout=30)
    for run in runs:
        stored = store.get(run.task_id)
        assert stored is not None
        assert stored.status is run.status  # what the process says is what is stored
        assert stored.status_version == run.snapshot().status_version
    store.close()


def test_a_store_without_group_commit_writes_each_end_alone(make_controller: Make) -> None:
    class CountingMemory(Together, InMemoryTaskStore):
        def __init__(self) -> None:
            self.calls = []
            super().__init__()

        def write_transitions_together(self, writes: Sequence[Any]) -> list[BaseException | None]:
            self.calls.append([snapshot.task_id for snapshot, _, _ in writes])
            raise AssertionError("not a group-commit store: never called")

    store = CountingMemory()
    c = make_controller(store, max_workers=4)
    assert not c.capabilities.group_commit
    noop = c.task(lambda token: None, name="noop")
    runs = [c.submit(noop) for _ in range(50)]
    for run in runs:
        assert run.wait(10).status is TaskStatus.SUCCEEDED
    assert store.calls == []


def test_dispatchers_say_whether_a_run_is_waiting() -> None:
    from types import SimpleNamespace

    from chongming_task._dispatch import FairDispatcher, FifoDispatcher
    from chongming_task.clock import SystemClock

    for dispatcher in (
        FifoDispatcher(SystemClock()),
        FairDispatcher(SystemClock(), max_parallel_per_bucket=1),
    ):
        assert not dispatcher.ready() and dispatcher.take() is None  # take() never waits
        for _ in range(2):
            dispatcher.put(SimpleNamespace(bucket=1))  # type: ignore[arg-type]
        assert dispatcher.ready()
        first = dispatcher.get()
        assert first is not None
        if isinstance(dispatcher, FairDispatcher):  # one per bucket may run: not yet
            assert dispatcher.take() is None
            dispatcher.done(first)
        assert dispatcher.take() is not None
        assert not dispatcher.ready()
        dispatcher.close()
        assert dispatcher.take() is None and dispatcher.get() is None  # closed


def test_a_conflict_on_an_end_costs_the_start_beside_it_nothing(
    tmp_path: Path, make_controller: Make
) -> None:
    """Another writer moves a finished run's task in the store: its end, written beside
    the next run's start, conflicts (the task is desynced) and that start lands all the
    same, in the same store call."""
    store = CountingSqlite(tmp_path / "t.db")
    c = make_controller(store, max_workers=1)
    gate = threading.Event()
    outsider = SqliteTaskStore(tmp_path / "t.db")

    @c.task(name="gate")
    def hold(token: CancellationToken) -> None:
        gate.wait(10)

    @c.task(name="moved")
    def moved(token: CancellationToken) -> None:
        stored = outsider.get(token.task_id)
        assert stored is not None
        outsider.save(
            replace(stored, status_version=stored.status_version + 1),
            expect_version=stored.status_version,
        )

    @c.task(name="next")
    def step(token: CancellationToken) -> int:
        return 7

    first = c.submit(hold)
    a = c.submit(moved)
    b = c.submit(step)  # queued behind a: a's end goes beside b's start
    gate.set()
    first.wait(10)
    assert b.wait(10).outcome == 7
    assert a.wait(10).status is TaskStatus.SUCCEEDED  # what the process saw
    assert [a.task_id, b.task_id] in store.calls  # the two went in one call
    assert a.task_id in c.desynced_tasks
    stored_a = store.get(a.task_id)
    assert stored_a is not None and stored_a.status is TaskStatus.RUNNING  # never overwritten
    assert [t.to_status for t in store.history(a.task_id)] == LIFE[:3]
    stored_b = store.get(b.task_id)
    assert stored_b is not None and stored_b.status is TaskStatus.SUCCEEDED
    assert [t.to_status for t in store.history(b.task_id)] == LIFE
    outsider.close()


def test_a_together_call_that_fails_as_a_whole_falls_back_to_one_write_each(
    tmp_path: Path, make_controller: Make
) -> None:
    """A store whose ``write_transitions_together`` raises for the whole call (breaking
    its contract, or a value it cannot encode): each write of the pair is made alone
    right away, so no task waits for a catch-up because of another."""
    from chongming_task import StoreError

    class Refusing(CountingSqlite):
        def write_transitions_together(self, writes: Sequence[Any]) -> list[BaseException | None]:
            self.calls.append([snapshot.task_id for snapshot, _, _ in writes])
            raise StoreError("refused as a whole")

    store = Refusing(tmp_path / "t.db")
    c = make_controller(store, max_workers=1)
    gate = threading.Event()

    @c.task(name="gate")
    def hold(token: CancellationToken) -> None:
        gate.wait(10)

    @c.task(name="echo")
    def echo(token: CancellationToken, n: int) -> int:
        return n

    first = c.submit(hold)
    runs = [c.submit(echo, n) for n in range(20)]
    gate.set()
    first.wait(10)
    for n, run in enumerate(runs):
        assert run.wait(10).outcome == n
        stored = store.get(run.task_id)
        assert stored is not None and stored.status is TaskStatus.SUCCEEDED
        assert [t.to_status for t in store.history(run.task_id)] == LIFE
    assert store.calls  # the pairs were tried together first
    assert not c.desynced_tasks and all(run.written for run in runs)
