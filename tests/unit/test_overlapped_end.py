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
