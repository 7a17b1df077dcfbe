"""On a store that commits side-by-side writes together (``group_commit``), the workers'
own writes (a run's start, its end) go to the node's writer thread, which writes all
that is queued in one store call. What must hold: a worker never waits for its writes;
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
    StoreError,
    TaskSnapshot,
    TaskStatus,
    Transition,
    WaitTimeout,
)
from chongming_task.run.writers import BehindWriter, Writer
from tests.conftest import here, wait_until
from tests.unit.test_behind_writer import (
    LIFE,
    Make,
    assert_only_the_moved_task_desynced,
    conflict_tasks,
    stored_life,
)
from tests.unit.test_behind_writer import Held as HeldBehind

S = TaskStatus


class Held(SqliteTaskStore):
    """Holds every task write (of the task named ``hold``, if given) until ``release``
    is set; records each together call's task ids. It hides the store's
    ``write_transitions_behind``, so its node writes through the threaded ``Writer``
    (the one a Postgres node has); ``test_behind_writer.py`` covers the other."""

    write_transitions_behind = None  # type: ignore[assignment]  # not declared here

    def __init__(self, path: Path, hold: str | None = None) -> None:
        super().__init__(path)
        self.calls: list[list[str]] = []
        self.holding = threading.Event()  # a write is being held
        self.release = threading.Event()
        self._hold = hold

    def _held(self, snapshots: Sequence[TaskSnapshot]) -> None:
        if self.release.is_set():
            return
        if self._hold is None or any(s.name == self._hold for s in snapshots):
            self.holding.set()
            assert self.release.wait(10)

    def write_transitions(
        self, snapshot: TaskSnapshot, *, expect_version: int, transitions: Sequence[Transition]
    ) -> None:
        self._held([snapshot])
        super().write_transitions(snapshot, expect_version=expect_version, transitions=transitions)

    def write_transitions_together(self, writes: Sequence[Any]) -> list[BaseException | None]:
        self.calls.append([snapshot.task_id for snapshot, _, _ in writes])
        self._held([snapshot for snapshot, _, _ in writes])
        return super().write_transitions_together(writes)


# Both writers, with the double that holds each one's writes: the threaded writer's
# together-calls (``Held``), or the writes a ``BehindWriter`` queues (``HeldBehind``).
BOTH = pytest.mark.parametrize("held", [Held, HeldBehind], ids=["threaded", "behind"])


@BOTH
def test_workers_run_on_while_their_writes_are_held(
    tmp_path: Path, make_controller: Make, held: type[Held | HeldBehind]
) -> None:
    """Every write held: the workers still run every task's function, and no waiter is
    released (no end is in the store). Released: every task lands, whole trail (the
    threaded writer's in a few shared store calls)."""
    store = held(tmp_path / "t.db")
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
    if held is Held:  # one call per write behind: they share commits, not calls
        assert any(len(call) > 1 for call in store.calls), "no writes were shared"
    assert not c.desynced_tasks and all(run.written for run in runs)


@BOTH
def test_a_control_call_returns_once_its_transition_is_stored(
    tmp_path: Path, make_controller: Make, held: type[Held | HeldBehind]
) -> None:
    """The run's start is held in the writer (handed over while the function runs, by
    a ``BehindWriter``): ``stop()`` waits for it (whoever holds a run's write lock
    writes what is queued before letting go), and once it returns the store has the
    stop."""
    store = held(tmp_path / "t.db")
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


@pytest.mark.parametrize("store_class", [SqliteTaskStore, Held], ids=["behind", "threaded"])
def test_close_leaves_no_end_unwritten(tmp_path: Path, store_class: type[SqliteTaskStore]) -> None:
    store = store_class(tmp_path / "t.db")
    if isinstance(store, Held):
        store.release.set()
    c = Controller(store, max_workers=4)
    assert isinstance(
        c._services.writer, BehindWriter if store_class is SqliteTaskStore else Writer
    )
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


def test_a_conflict_in_a_shared_write_costs_the_others_nothing(
    tmp_path: Path, make_controller: Make
) -> None:
    """Another writer moves a task in the store while its start waits in the writer: its
    write, shared with another run's in one store call, conflicts (the task is desynced)
    and the other lands all the same."""
    store = Held(tmp_path / "t.db", hold="gate")
    c = make_controller(store, max_workers=3)
    outsider = SqliteTaskStore(tmp_path / "t.db")
    gated = threading.Event()
    hold, moved, step = conflict_tasks(c, outsider, gated)

    first = c.submit(hold)
    assert gated.wait(5) and store.holding.wait(5)  # the writer holds the gate's write
    a = c.submit(moved)
    b = c.submit(step)
    wait_until(lambda: a.status is S.SUCCEEDED and b.status is S.SUCCEEDED)
    store.release.set()
    first.wait(10)
    assert b.wait(10).outcome == 7
    a.wait(10)  # the store's word now (the outsider's), not the run's
    assert a.snapshot().status is S.SUCCEEDED  # what the process saw
    assert any({a.task_id, b.task_id} <= set(call) for call in store.calls)  # one call
    assert_only_the_moved_task_desynced(c, store, a, b)
    outsider.close()


def test_a_together_call_that_fails_as_a_whole_falls_back_to_one_write_each(
    tmp_path: Path, make_controller: Make
) -> None:
    """A store whose ``write_transitions_together`` raises for the whole call (breaking
    its contract, or a value it cannot encode): each write is made alone right away, so
    no task waits for a catch-up because of another."""

    class Refusing(Held):
        def write_transitions_together(self, writes: Sequence[Any]) -> list[BaseException | None]:
            self.calls.append([snapshot.task_id for snapshot, _, _ in writes])
            raise StoreError("refused as a whole")

    store = Refusing(tmp_path / "t.db", hold="gate")
    c = make_controller(store, max_workers=4)
    gated = threading.Event()

    @c.task(name="gate")
    def hold(token: CancellationToken) -> None:
        gated.set()

    @c.task(name="echo")
    def echo(token: CancellationToken, n: int) -> int:
        return n

    first = c.submit(hold)
    assert gated.wait(5) and store.holding.wait(5)
    runs = [c.submit(echo, n) for n in range(20)]
    wait_until(lambda: all(run.status is S.SUCCEEDED for run in runs))
    store.release.set()
    first.wait(10)
    for n, run in enumerate(runs):
        assert run.wait(10).outcome == n
        stored = store.get(run.task_id)
        assert stored is not None and stored.status is S.SUCCEEDED
        assert stored_life(store, run.task_id) == LIFE
    assert any(len(call) > 1 for call in store.calls)  # tried together first
    assert not c.desynced_tasks and all(run.written for run in runs)


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
