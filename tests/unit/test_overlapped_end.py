"""On a store that commits side-by-side writes together (``group_commit``), a worker whose
next run is waiting hands its run's end write to a closer thread and starts that run
meanwhile. What must not
change: ``wait()`` returns only once the end is in the store, the run's slot is freed only
then, and ``close()`` leaves nothing unwritten. A store without group commit keeps the
worker writing its own ends (a thread hop would cost it more than it saves)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    InMemoryTaskStore,
    SqliteTaskStore,
    TaskStatus,
)

Make = Callable[..., Controller]
LIFE = [TaskStatus.QUEUED, TaskStatus.STARTING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED]


def closers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith("-closer")]


def test_wait_returns_once_the_end_is_stored_and_nothing_is_lost(
    tmp_path: Path, make_controller: Make
) -> None:
    store = SqliteTaskStore(tmp_path / "t.db")
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
    assert closers(), "with runs waiting, the ends were written on the workers' threads"
    for run in runs[::37]:
        assert [t.to_status for t in store.history(run.task_id)] == LIFE


def test_close_leaves_no_end_unwritten(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "t.db")
    c = Controller(store, max_workers=4)
    noop = c.task(lambda token: None, name="noop")
    runs = [c.submit(noop) for _ in range(200)]
    c.close(timeout=30)
    assert not closers()  # every closer drained and joined
    for run in runs:
        stored = store.get(run.task_id)
        assert stored is not None
        assert stored.status is run.status  # what the process says is what is stored
        assert stored.status_version == run.snapshot().status_version
    store.close()


def test_a_store_without_group_commit_writes_ends_on_the_worker(make_controller: Make) -> None:
    c = make_controller(InMemoryTaskStore(), max_workers=4)
    assert not c.capabilities.group_commit
    noop = c.task(lambda token: None, name="noop")
    runs = [c.submit(noop) for _ in range(50)]
    for run in runs:
        assert run.wait(10).status is TaskStatus.SUCCEEDED
    assert not closers()


def test_dispatchers_say_whether_a_run_is_waiting() -> None:
    from types import SimpleNamespace

    from chongming_task._dispatch import FairDispatcher, FifoDispatcher
    from chongming_task.clock import SystemClock

    for dispatcher in (
        FifoDispatcher(SystemClock()),
        FairDispatcher(SystemClock(), max_parallel_per_bucket=1),
    ):
        assert not dispatcher.ready()
        dispatcher.put(SimpleNamespace(bucket=1))  # type: ignore[arg-type]
        assert dispatcher.ready()
        assert dispatcher.get() is not None
        assert not dispatcher.ready()


def test_a_slow_end_write_holds_its_worker_only_after_a_few_more_runs(
    tmp_path: Path, make_controller: Make
) -> None:
    """One end write that does not return (a slow statement) holds neither its waiters'
    truth nor the worker at once: the worker goes on with the next runs until
    ``_ENDS_AHEAD`` ends wait, then waits; nothing is reported done before it is stored."""
    from chongming_task._workers import _ENDS_AHEAD

    held = threading.Event()
    release = threading.Event()

    class SlowEnd(SqliteTaskStore):
        slow_id = ""

        def write_transitions(self, snapshot, *, expect_version, transitions):  # type: ignore[no-untyped-def]
            if snapshot.task_id == self.slow_id and snapshot.status is TaskStatus.SUCCEEDED:
                held.set()
                release.wait(10)
            super().write_transitions(
                snapshot, expect_version=expect_version, transitions=transitions
            )

    store = SlowEnd(tmp_path / "t.db")
    c = make_controller(store, max_workers=1)
    started: list[int] = []
    gate = threading.Event()

    @c.task(name="gate")
    def hold(token: CancellationToken) -> None:
        gate.wait(10)

    @c.task(name="step")
    def step(token: CancellationToken, n: int) -> int:
        started.append(n)
        return n

    first = c.submit(hold)
    slow = c.submit(step, 0)
    store.slow_id = slow.task_id
    rest = [c.submit(step, n) for n in range(1, 10)]
    gate.set()
    assert held.wait(10)
    pause = threading.Event()  # never set: a sleep
    for _ in range(500):
        if len(started) >= _ENDS_AHEAD + 1:
            break
        pause.wait(0.01)
    pause.wait(0.2)  # the worker would start more now if it were not held
    assert started == list(range(_ENDS_AHEAD + 1))  # the slow one, then the ends ahead
    with pytest.raises(TimeoutError):
        slow.wait(0.05)  # its end is not stored: not done
    assert store.get(slow.task_id).status is TaskStatus.RUNNING  # type: ignore[union-attr]
    release.set()
    first.wait(10)
    for n, run in enumerate([slow, *rest]):
        assert run.wait(10).outcome == n
        assert store.get(run.task_id).status is TaskStatus.SUCCEEDED  # type: ignore[union-attr]
    assert started == list(range(10))
