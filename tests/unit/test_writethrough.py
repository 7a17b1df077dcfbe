"""Write-through: failed writes catch up, external writers are detected, nothing freezes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    InMemoryTaskStore,
    SqliteTaskStore,
    TaskDesynced,
    TaskSnapshot,
    TaskStatus,
)
from chongming_task.testing import FaultyStore
from tests.conftest import run_of, wait_until

S = TaskStatus
Make = Callable[..., Controller]


def _fails_save_to(status: TaskStatus) -> Callable[..., bool]:
    fired = threading.Event()

    def predicate(snapshot: TaskSnapshot, **_: object) -> bool:
        if snapshot.status is status and not fired.is_set():
            fired.set()
            return True
        return False

    return predicate


def test_one_failed_write_no_longer_freezes_the_task(make_controller: Make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """docs/design.md, "Write-through". ``_persist`` used ``expect_version = version - 1``; one
    failed ``save`` (a network blip) left the store at k-1 while memory went on to k, every
    later write conflicted, the task froze at ``starting`` in the store, and reconcile
    finally judged it LOST. Now the store catches up and jumps versions."""
    store = FaultyStore(SqliteTaskStore(tmp_path / "t.db"))
    store.fail_when("save", _fails_save_to(S.RUNNING))
    c = make_controller(store)
    run = c.submit(c.task(lambda token: "done", name="blip"))
    assert run.result(5) == "done"
    assert store.failures == {"save": 1}
    stored = store.inner.get(run.task_id)
    assert stored is not None
    assert stored.status is S.SUCCEEDED and stored.status_version == 4 and stored.outcome == "done"
    trail = store.inner.history(run.task_id)
    assert [t.to_status for t in trail] == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]
    assert [t.version for t in trail] == [1, 2, 3, 4]
    assert c.desynced_tasks == frozenset()


def test_an_outage_mid_run_is_caught_up_by_the_supervisor(make_controller: Make) -> None:
    store = FaultyStore(InMemoryTaskStore())
    c = make_controller(store)
    gate = threading.Event()

    @c.task(name="through-outage")
    def work(token: CancellationToken) -> int:
        gate.wait(5)
        return 7

    run = c.submit(work)
    # The store's view, not the process's: the run's status changes before its write.
    wait_until(lambda: store.inner.get(run.task_id).status is S.RUNNING)  # type: ignore[union-attr]
    store.outage()
    gate.set()
    assert run.result(5) == 7  # the process knows; the store does not yet
    assert store.inner.get(run.task_id).status is S.RUNNING  # type: ignore[union-attr]
    store.restore()
    wait_until(
        lambda: store.inner.get(run.task_id).status is S.SUCCEEDED,  # type: ignore[union-attr]
        what="supervisor catch-up",
    )
    assert [t.to_status for t in store.inner.history(run.task_id)] == [
        S.QUEUED,
        S.STARTING,
        S.RUNNING,
        S.SUCCEEDED,
    ]
    wait_until(lambda: c.held() == [], what="caught-up run released")


def test_close_catches_up_what_is_still_unwritten() -> None:
    store = FaultyStore(InMemoryTaskStore())
    c = Controller(store, activity_interval=60)  # the supervisor will not get there first
    gate = threading.Event()

    @c.task(name="late")
    def work(token: CancellationToken) -> int:
        gate.wait(5)
        return 1

    run = c.submit(work)
    wait_until(lambda: run.status is S.RUNNING)
    store.fail_next("save")
    gate.set()
    run.wait(5)
    assert store.inner.get(run.task_id).status is S.RUNNING  # type: ignore[union-attr]
    c.close()
    stored = store.inner.get(run.task_id)
    assert stored is not None and stored.status is S.SUCCEEDED and stored.status_version == 4
    assert len(store.inner.history(run.task_id)) == 4


def test_the_buffer_is_bounded_and_the_snapshot_still_catches_up() -> None:
    store = FaultyStore(InMemoryTaskStore())
    c = Controller(store, writethrough_buffer=2, activity_interval=60)
    gate = threading.Event()

    @c.task(name="bounded")
    def work(token: CancellationToken) -> int:
        gate.wait(5)
        return 1

    run = c.submit(work)
    wait_until(lambda: run.status is S.RUNNING)
    store.outage()
    c.pause(run.task_id)
    c.resume(run.task_id)
    gate.set()
    run.wait(5)  # pausing, running, succeeded unwritten: 3 > buffer of 2
    store.restore()
    c.close()
    stored = store.inner.get(run.task_id)
    assert stored is not None and stored.status is S.SUCCEEDED
    assert stored.status_version == run.snapshot().status_version
    versions = [t.version for t in store.inner.history(run.task_id)]
    assert run_of(run).writes.dropped >= 1
    assert versions[-2:] == [stored.status_version - 1, stored.status_version]
    assert len(versions) < stored.status_version  # the dropped one is missing, honestly


def test_an_external_writer_desyncs_the_task_instead_of_being_overwritten(
    make_controller: Make,
) -> None:
    store = InMemoryTaskStore()
    c = make_controller(store)
    gate = threading.Event()

    @c.task(name="contested")
    def work(token: CancellationToken) -> int:
        gate.wait(5)
        return 1

    run = c.submit(work)
    wait_until(lambda: run.status is S.RUNNING)
    stored = store.get(run.task_id)
    assert stored is not None
    foreign = replace(stored, status=S.LOST, status_version=stored.status_version + 1)
    store.save(foreign, expect_version=stored.status_version)  # someone else wrote it
    gate.set()
    with pytest.raises(TaskDesynced) as told:
        run.result(5)  # the caller hears the store's word, and its outcome's fate
    assert told.value.snapshot.status is S.LOST and told.value.local.outcome == 1
    assert run.wait(5).status is S.LOST
    assert c.desynced_tasks == frozenset({run.task_id})
    after = store.get(run.task_id)
    assert after is not None and after.status is S.LOST  # not clobbered
    assert all(t.to_status is not S.SUCCEEDED for t in store.history(run.task_id))


class _Failed:
    """Queued writes that failed, one error: what a store's ``write_transitions_behind``
    hands back for a write that could not be made."""

    queued_at = 0.0
    settled = True

    def __init__(self, error: BaseException) -> None:
        self._error = error

    def errors(self) -> list[BaseException | None]:
        return [self._error]

    def serve(self) -> None:
        pass

    def wait(self) -> None:
        pass


def test_a_failed_write_on_the_sqlite_fast_path_also_catches_up(
    make_controller: Make, tmp_path: Path
) -> None:
    """The write-through's catch-up again, through SqliteTaskStore.write_transitions
    (rows encoded before the lock): one failed write of `running` is caught up by the
    final one."""
    from chongming_task import StoreError, Transition

    blipped = threading.Event()

    class BlipStore(SqliteTaskStore):
        def write_transitions(
            self,
            snapshot: TaskSnapshot,
            *,
            expect_version: int,
            transitions: Sequence[Transition],
        ) -> None:
            if snapshot.status is S.RUNNING and not blipped.is_set():
                blipped.set()
                raise StoreError("network blip (injected)")
            super().write_transitions(
                snapshot, expect_version=expect_version, transitions=transitions
            )

        def write_transitions_behind(self, writes: Sequence[Any]) -> Any:
            if any(s.status is S.RUNNING for s, _, _ in writes) and not blipped.is_set():
                blipped.set()
                return _Failed(StoreError("network blip (injected)"))
            return super().write_transitions_behind(writes)

    def after_the_blip(token: CancellationToken) -> str:
        # The start is written while the function runs (the node's writer hands it
        # over): end only once it failed, so the end is a write of its own, which
        # catches the start up.
        assert blipped.wait(5)
        return "done"

    store = BlipStore(tmp_path / "blip.db")
    c = make_controller(store)
    run = c.submit(c.task(after_the_blip, name="blip"))
    assert run.result(5) == "done" and blipped.is_set()
    stored = store.get(run.task_id)
    assert stored is not None and stored.status is S.SUCCEEDED and stored.status_version == 4
    assert [t.to_status for t in store.history(run.task_id)] == [
        S.QUEUED,
        S.STARTING,
        S.RUNNING,
        S.SUCCEEDED,
    ]
    assert c.desynced_tasks == frozenset()
