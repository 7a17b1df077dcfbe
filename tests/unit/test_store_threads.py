"""The built-in stores under real threads: compare-and-set stays exact without one big lock.

The in-memory store creates and appends with single atomic dict operations and guards
each task's compare-and-set with one of several striped locks; these tests race real
threads on the same task to prove no write is lost and no stale version wins.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chongming_task.errors import ConcurrencyConflict, TaskAlreadyExists
from chongming_task.model import TaskSnapshot, TaskStatus, Transition
from chongming_task.stores import InMemoryTaskStore, SqliteTaskStore, TaskStore

T0 = datetime(2026, 3, 1, tzinfo=UTC)
THREADS = 8


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> TaskStore:
    if request.param == "memory":
        return InMemoryTaskStore()
    return SqliteTaskStore(tmp_path / "threads.db")


@pytest.fixture(autouse=True)
def _switch_often() -> Iterator[None]:
    """Switch threads every microsecond so a missing lock shows up as a failure."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _snapshot(task_id: str, version: int = 1) -> TaskSnapshot:
    return TaskSnapshot(
        task_id=task_id,
        name="race",
        status=TaskStatus.QUEUED,
        status_version=version,
        created_at=T0,
    )


def _race(n: int, body: Callable[[int], None]) -> None:
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            body(i)
        except BaseException as exc:  # collected: an assertion in a thread must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_exactly_one_of_eight_threads_wins_each_compare_and_set(store: TaskStore) -> None:
    store.create(_snapshot("t"))
    for version in range(1, 51):
        won: list[int] = []
        lost: list[int] = []

        def attempt(
            i: int, version: int = version, won: list[int] = won, lost: list[int] = lost
        ) -> None:
            try:
                store.save(_snapshot("t", version + 1), expect_version=version)
                won.append(i)
            except ConcurrencyConflict:
                lost.append(i)

        _race(THREADS, attempt)
        assert len(won) == 1 and len(lost) == THREADS - 1, (version, won, lost)
        stored = store.get("t")
        assert stored is not None and stored.status_version == version + 1


def test_exactly_one_of_eight_threads_creates_an_id(store: TaskStore) -> None:
    for round_ in range(20):
        created: list[int] = []

        def attempt(i: int, round_: int = round_, created: list[int] = created) -> None:
            try:
                store.create(_snapshot(f"id-{round_}"))
                created.append(i)
            except TaskAlreadyExists:
                pass

        _race(THREADS, attempt)
        assert len(created) == 1, created


def test_touch_racing_saves_loses_neither(store: TaskStore) -> None:
    """One thread walks a task through 200 versions while others touch its lease: every
    save lands (no stale version ever accepted) and the last lease touched is kept."""
    store.create(_snapshot("t"))
    stop = threading.Event()
    last_lease: dict[int, datetime] = {}

    def work(i: int) -> None:
        if i == 0:
            try:
                for version in range(1, 201):
                    store.save(_snapshot("t", version + 1), expect_version=version)
            finally:
                stop.set()
            return
        n = 0
        while not stop.is_set():
            n += 1
            until = T0 + timedelta(seconds=i * 100_000 + n)
            store.touch("t", lease_owner=f"node-{i}", lease_until=until)
            last_lease[i] = until

    _race(4, work)
    stored = store.get("t")
    assert stored is not None and stored.status_version == 201
    assert stored.lease_until in set(last_lease.values())


def test_concurrent_appends_keep_every_transition_once(store: TaskStore) -> None:
    store.create(_snapshot("t"))

    def append(i: int) -> None:
        for version in range(1, 101):  # every thread appends the same 100 transitions
            store.append(
                Transition(
                    task_id="t",
                    version=version,
                    from_status=None,
                    to_status=TaskStatus.QUEUED,
                    at=T0,
                    actor=f"thread-{i}",
                )
            )

    _race(THREADS, append)
    assert [t.version for t in store.history("t")] == list(range(1, 101))


def _queued(task_id: str, version: int, actor: str) -> Transition:
    return Transition(
        task_id=task_id,
        version=version,
        from_status=None if version == 1 else TaskStatus.QUEUED,
        to_status=TaskStatus.QUEUED,
        at=T0,
        actor=actor,
    )


def test_a_create_racing_appends_of_its_own_trail_loses_none(store: TaskStore) -> None:
    """The in-memory store makes a new task's trail without a lock (one ``setdefault``)
    and merges every other write under the task's stripe: appends landing before, during
    and after the create all stay, each version once, the first writer's. Every thread
    walks the tasks in the same order, so the create meets the appends."""
    tasks = [f"t{n}" for n in range(60)]

    def body(i: int) -> None:
        for task_id in tasks:
            if i == 0:
                store.create_many([(_snapshot(task_id), _queued(task_id, 1, "creator"))])  # type: ignore[attr-defined]
            for version in range(2, 5):
                store.append(_queued(task_id, version, f"thread-{i}"))

    _race(THREADS, body)
    for task_id in tasks:
        history = store.history(task_id)
        assert [t.version for t in history] == list(range(1, 5)), task_id
        assert history[0].actor == "creator"
        assert all(t.actor is not None and t.actor.startswith("thread-") for t in history[1:])
