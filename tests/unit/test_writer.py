"""On a store that commits side-by-side writes together (``group_commit``), the workers'
own writes (a run's start, its end) are queued behind them (``BehindWriter``). What must
hold: a worker never waits for its writes;
``wait()`` returns only once the end is in the store; a control call returns only once
its transition is; every transition reaches the trail in order; ``close()`` leaves
nothing unwritten; one write's conflict or failure costs the writes beside it nothing.
A store without group commit keeps writing on the worker."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    ControlOutcome,
    InMemoryTaskStore,
    SqliteTaskStore,
    TaskStatus,
    WaitTimeout,
)
from chongming_task.run.writers import BehindWriter
from tests.conftest import here, wait_until
from tests.unit.test_behind_writer import (
    LIFE,
    Held,
    Make,
    stored_life,
)

S = TaskStatus


def test_workers_run_on_while_their_writes_are_held(tmp_path: Path, make_controller: Make) -> None:
    """Every write held: the workers still run every task's function, and no waiter is
    released (no end is in the store). Released: every task lands, whole trail."""
    store = Held(tmp_path / "t.db")
    c = make_controller(store, max_workers=4)
    ran: list[int] = []

    @c.task(name="double")
    def double(token: CancellationToken, n: int) -> int:
        ran.append(n)
        return 2 * n

    runs = [c.submit(double, n) for n in range(40)]
    wait_until(lambda: len(ran) == 40, what="every function to run, writes held")
    assert store.holding.is_set()
    with pytest.raises(WaitTimeout):
        runs[-1].wait(0.1)  # its end is not in the store
    assert not any(run.done() for run in runs)
    assert all(stored.status is S.QUEUED for stored in store.query())
    store.release.set()
    for n, run in enumerate(runs):
        final = run.wait(10)
        assert final.status is S.SUCCEEDED and final.outcome == 2 * n
        stored = store.get(run.task_id)  # read at once: the end is already there
        assert stored is not None and stored.status is S.SUCCEEDED and stored.outcome == 2 * n
        assert stored.status_version == final.status_version
        assert stored_life(store, run.task_id) == LIFE
    assert not c.desynced_tasks and all(run.written for run in runs)


def test_a_control_call_returns_once_its_transition_is_stored(
    tmp_path: Path, make_controller: Make
) -> None:
    """The run's start is held in the writer (handed over while the function runs, by
    a ``BehindWriter``): ``stop()`` waits for it (whoever holds a run's write lock
    writes what is queued before letting go), and once it returns the store has the
    stop."""
    store = Held(tmp_path / "t.db")
    c = make_controller(store, max_workers=1)
    running = threading.Event()

    @c.task(name="loop")
    def loop(token: CancellationToken) -> None:
        running.set()
        while True:
            token.checkpoint()
            token.sleep(0.01)

    run = c.submit(loop)
    assert running.wait(5) and store.holding.wait(5)
    outcome: list[ControlOutcome] = []
    stopper = threading.Thread(target=lambda: outcome.append(run.stop(reason="enough").outcome))
    stopper.start()
    stopper.join(0.3)
    assert stopper.is_alive() and not outcome  # its write waits behind the held start
    store.release.set()
    stopper.join(5)
    assert outcome == [ControlOutcome.STOPPING]
    stored = store.get(run.task_id)
    assert stored is not None and stored.status in (S.STOPPING, S.STOPPED)
    assert stored_life(store, run.task_id)[:4] == [S.QUEUED, S.STARTING, S.RUNNING, S.STOPPING]
    assert run.wait(5).status is S.STOPPED
    assert stored_life(store, run.task_id) == [*LIFE[:3], S.STOPPING, S.STOPPED]


def test_close_leaves_no_end_unwritten(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "t.db")
    c = Controller(store, max_workers=4)
    assert isinstance(c._services.writer, BehindWriter)
    noop = c.task(lambda token: None, name="noop")
    runs = [c.submit(noop) for _ in range(200)]
    c.close(timeout=30)
    for run in runs:
        stored = store.get(run.task_id)
        assert stored is not None
        assert stored.status is run.status  # what the process says is what is stored
        assert stored.status_version == run.snapshot().status_version
    store.close()


def test_a_store_without_group_commit_writes_on_the_worker(make_controller: Make) -> None:
    class NoTogether(InMemoryTaskStore):
        def write_transitions_together(self, writes: Sequence[Any]) -> list[BaseException | None]:
            raise AssertionError("not a group-commit store: never called")

    store = NoTogether()
    c = make_controller(store, max_workers=4)
    assert not c.capabilities.group_commit
    started = threading.Event()

    @c.task(name="look")
    def look(token: CancellationToken) -> None:
        stored = store.get(here().task_id)  # written before the function is called
        assert stored is not None and stored.status is S.RUNNING
        started.set()

    runs = [c.submit(look) for _ in range(50)]
    for run in runs:
        assert run.wait(10).status is S.SUCCEEDED
    assert started.is_set()


def test_the_group_commit_counts_its_batches_and_their_writes(tmp_path: Path) -> None:
    """What benches read to say how well writes are grouped: every task's create is a
    write, and a batch carries one or more."""
    store = SqliteTaskStore(tmp_path / "t.db")
    group = store.connection.group
    assert group is not None and (group.commits, group.writes) == (0, 0)
    with Controller(store, max_workers=4) as c:
        noop = c.task(lambda token: None, name="noop")
        for run in [c.submit(noop) for _ in range(200)]:
            run.wait(30)
    assert 1 <= group.commits <= group.writes
    assert group.writes >= 200
    store.close()
