"""The core runtime through the Controller: a task's life, its controls, closing and
serving (retries, results, timeouts and activity: test_attempts.py)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from chongming_task import (
    CancellationToken,
    ConfigurationError,
    Controller,
    ControllerClosed,
    InMemoryTaskStore,
    Progress,
    RetryPolicy,
    StoreError,
    TaskNotFound,
    TaskStatus,
    TaskStore,
    TaskUnsuccessful,
    UnknownTask,
    WaitTimeout,
    present,
)
from chongming_task.testing import FaultyStore
from tests.conftest import run_of, wait_until
from tests.unit.core_only import core_only

S = TaskStatus
Make = Callable[..., Controller]
FAST = RetryPolicy(base_delay=0.001, jitter=0.0)


def statuses(controller: Controller, task_id: str) -> list[TaskStatus]:
    return [t.to_status for t in controller.history(task_id)]


def looping(token: CancellationToken, started: threading.Event | None = None) -> str:
    if started is not None:
        started.set()
    while True:
        token.checkpoint()
        token.sleep(0.002)


def test_a_task_runs_to_success_and_every_transition_is_stored(
    store: TaskStore, make_controller: Make
) -> None:
    c = make_controller(store)

    @c.task(name="add", tags={"math"})
    def add(token: CancellationToken, a: int, b: int) -> int:
        token.checkpoint(Progress(current=1, total=1))
        return a + b

    run = c.submit(add, 2, b=3)
    assert run.result(timeout=5) == 5
    stored = c.get(run.task_id)
    assert stored.status is S.SUCCEEDED and stored.outcome == 5
    assert stored.status_version == 4 and stored.attempt == 1
    assert stored.tags == frozenset({"math"}) and stored.owner == c.owner
    assert stored.started_at is not None and stored.ended_at is not None
    assert statuses(c, run.task_id) == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]
    assert [t.version for t in c.history(run.task_id)] == [1, 2, 3, 4]
    assert c.history(run.task_id) == run.history()
    assert c.stats()[S.SUCCEEDED] == 1


def test_a_finished_runs_history_is_nothing_the_garbage_collector_walks(
    store: TaskStore, make_controller: Make
) -> None:
    """A node holds every run its callers hold: the run's history (and the in-memory
    store's trail) are tuples of text, numbers and datetimes, which the collector stops
    tracking the first time it looks, where a list of ``Transition`` objects stayed
    tracked for life. What they give back is unchanged."""
    c = make_controller(store)

    @c.task(name="noop")
    def noop(token: CancellationToken) -> None:
        return None

    run = c.submit(noop)
    run.wait(5)
    gc.collect()
    assert not gc.is_tracked(run_of(run).writes.trail)
    if isinstance(store, InMemoryTaskStore):
        assert not gc.is_tracked(store._history[run.task_id])
    assert statuses(c, run.task_id) == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]
    assert c.history(run.task_id) == run.history()
    assert [t.reason for t in run.history()][1] == "attempt 1"


def test_submit_by_name_and_unknown_names(make_controller: Make) -> None:
    c = make_controller()
    c.task(lambda token: "hi", name="hello")
    assert c.tasks["hello"].submit().result(5) == "hi"
    with pytest.raises(UnknownTask, match="nope"):
        c.tasks["nope"].submit()


def test_get_and_control_of_an_unknown_task_raise_task_not_found(make_controller: Make) -> None:
    c = make_controller()
    with pytest.raises(TaskNotFound):
        c.get("missing")
    with pytest.raises(TaskNotFound):
        c.stop("missing")


def test_stop_a_running_task_at_its_next_checkpoint(
    store: TaskStore, make_controller: Make
) -> None:
    c = make_controller(store)
    started = threading.Event()
    run = c.submit(c.task(looping, name="loop"), started)
    assert started.wait(5)
    receipt = c.stop(run.task_id)
    assert receipt.outcome == "stopping" and not receipt.accepted
    final = run.wait(5)
    assert final.status is S.STOPPED
    assert statuses(c, run.task_id)[-2:] == [S.STOPPING, S.STOPPED]
    with pytest.raises(TaskUnsuccessful, match="stopped"):
        run.result(0)
    assert c.stop(run.task_id).outcome == "already-terminal"


def test_stop_or_cancel_of_a_queued_task_cancels_it(make_controller: Make) -> None:
    c = make_controller(max_workers=1)
    blocker_started = threading.Event()
    loop = c.task(looping, name="loop")
    blocker = c.submit(loop, blocker_started)
    assert blocker_started.wait(5)
    waiting = c.submit(loop)
    other = c.submit(loop)
    assert c.stop(waiting.task_id).outcome == "cancelled"
    assert c.cancel(other.task_id).outcome == "cancelled"
    assert waiting.wait(1).status is S.CANCELLED and other.wait(1).status is S.CANCELLED
    assert statuses(c, waiting.task_id) == [S.QUEUED, S.CANCELLED]
    c.stop(blocker.task_id)
    assert blocker.wait(5).status is S.STOPPED


def test_cancel_of_a_running_task_is_recorded_as_cancelled(make_controller: Make) -> None:
    c = make_controller()
    started = threading.Event()
    run = c.submit(c.task(looping, name="loop"), started)
    assert started.wait(5)
    assert c.cancel(run.task_id).outcome == "stopping"
    final = run.wait(5)
    assert final.status is S.CANCELLED and final.failure is None


def test_pause_blocks_at_a_checkpoint_and_resume_continues(
    store: TaskStore, make_controller: Make
) -> None:
    c = make_controller(store)
    started, release = threading.Event(), threading.Event()
    steps: list[int] = []

    @c.task(name="steps")
    def work(token: CancellationToken) -> int:
        started.set()
        for i in range(1000):
            token.checkpoint(Progress(current=i, total=1000))
            steps.append(i)
            if release.is_set():
                return len(steps)
            token.sleep(0.001)
        return -1

    run = c.submit(work)
    assert started.wait(5)
    assert c.pause(run.task_id).outcome == "pausing"
    wait_until(lambda: run.status is S.PAUSED, what="paused")
    frozen = len(steps)
    assert c.get(run.task_id).status is S.PAUSED
    threading.Event().wait(0.05)
    assert len(steps) == frozen, "a paused task must not progress"
    assert c.pause(run.task_id).outcome == "already-paused"
    assert c.resume(run.task_id).outcome == "resumed"
    wait_until(lambda: len(steps) > frozen, what="progress after resume")
    release.set()
    assert run.result(5) > frozen
    assert statuses(c, run.task_id) == [
        S.QUEUED,
        S.STARTING,
        S.RUNNING,
        S.PAUSING,
        S.PAUSED,
        S.RUNNING,
        S.SUCCEEDED,
    ]


def test_pause_resume_pause_is_acknowledged_every_time(make_controller: Make) -> None:
    """A regression: the checkpoint once set its acknowledgement only when *entering*
    the pause branch, so a pause requested right after a resume, while the task thread
    was still in the wait loop, was never acknowledged."""
    c = make_controller()
    started = threading.Event()
    run = c.submit(c.task(looping, name="loop"), started)
    assert started.wait(5)
    for round_ in range(20):
        c.pause(run.task_id)
        wait_until(lambda: run.status is S.PAUSED, timeout=5, what=f"pause #{round_}")
        # Resume and pause again while the task thread cannot re-check its wait condition
        # (we hold the token's condition): it wakes to find "paused" again, exactly the
        # window of the original defect.
        with run_of(run).signals._lock:
            c.resume(run.task_id)
            c.pause(run.task_id)
        wait_until(lambda: run.status is S.PAUSED, timeout=5, what=f"re-pause #{round_}")
        c.resume(run.task_id)
    c.stop(run.task_id)
    assert run.wait(5).status is S.STOPPED


def test_stop_a_paused_task(make_controller: Make) -> None:
    c = make_controller()
    started = threading.Event()
    run = c.submit(c.task(looping, name="loop"), started)
    assert started.wait(5)
    c.pause(run.task_id)
    wait_until(lambda: run.status is S.PAUSED)
    c.stop(run.task_id)
    assert run.wait(5).status is S.STOPPED


def test_pause_requested_before_start_takes_effect_when_it_runs(make_controller: Make) -> None:
    c = make_controller(max_workers=1)
    blocker_started = threading.Event()
    loop = c.task(looping, name="loop")
    blocker = c.submit(loop, blocker_started)
    assert blocker_started.wait(5)
    later = c.submit(loop)
    receipt = c.pause(later.task_id)
    # The receipt says what happened: nothing yet in the store, a pause waiting for it.
    assert receipt.outcome == "pause-pending" and receipt.status is S.QUEUED
    assert present.control_outcome(receipt).startswith("pause pending: queued, not started")
    assert c.get(later.task_id).status is S.QUEUED
    c.stop(blocker.task_id)
    wait_until(lambda: later.status is S.PAUSED, what="paused on start")
    c.resume(later.task_id)
    wait_until(lambda: later.status is S.RUNNING)
    c.stop(later.task_id)
    assert later.wait(5).status is S.STOPPED


def test_submit_fails_cleanly_when_the_store_refuses_the_task(make_controller: Make) -> None:
    store = FaultyStore(InMemoryTaskStore())
    c = make_controller(store)
    store.fail_next("create")
    with pytest.raises(StoreError, match="injected"):
        c.submit(c.task(lambda token: 1, name="one"))
    assert c.held() == [] and store.inner.query() == []


def test_close_cancels_waiting_and_stops_running_tasks_and_joins_threads() -> None:
    before = set(threading.enumerate())  # (a store another test left open keeps its own)
    store = InMemoryTaskStore()
    c = Controller(store, max_workers=1, activity_interval=0.02)
    started = threading.Event()
    loop = c.task(looping, name="loop")
    running = c.submit(loop, started)
    assert started.wait(5)
    waiting = c.submit(loop)
    c.close()
    assert running.snapshot().status is S.STOPPED
    assert waiting.snapshot().status is S.CANCELLED
    assert store.get(running.task_id).status is S.STOPPED  # type: ignore[union-attr]
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("chongming-")]
    with pytest.raises(ControllerClosed):
        c.submit(loop)
    c.close()  # idempotent


def test_wait_timeout_and_wait_idle(make_controller: Make) -> None:
    c = make_controller()
    started = threading.Event()
    run = c.submit(c.task(looping, name="loop"), started)
    with pytest.raises(WaitTimeout):
        run.wait(0.01)
    assert not c.wait_idle(0.01)
    c.stop(run.task_id)
    assert c.wait_idle(5)


def test_bucket_ownership_is_checked_at_submit_and_construction(make_controller: Make) -> None:
    with pytest.raises(ConfigurationError, match="out of range"):
        Controller(InMemoryTaskStore(), owned_buckets=[0, 64])
    c = make_controller(owned_buckets=range(0, 16), num_buckets=64)
    job = c.task(lambda token: 1, name="one")
    assert not c.owns_all_buckets and c.owns_bucket(3) and not c.owns_bucket(16)
    with pytest.raises(ConfigurationError, match="needs a bucket_key"):
        c.submit(job)
    mine = next(k for k in (f"k{i}" for i in range(1000)) if c.bucket_policy.bucket_for(k) < 16)
    theirs = next(k for k in (f"k{i}" for i in range(1000)) if c.bucket_policy.bucket_for(k) >= 16)
    with pytest.raises(ConfigurationError, match="does not own"):
        job.configure(bucket_key=theirs).submit()
    run = job.configure(bucket_key=mine).submit()
    assert run.wait(5).bucket == c.bucket_policy.bucket_for(mine)
    assert c.get(run.task_id).bucket_key == mine
    everything = make_controller(owned_buckets=range(64))
    assert everything.owns_all_buckets
    assert everything.submit(job).result(5) == 1  # no partition: no bucket_key needed


def _create_expired(store: TaskStore) -> None:
    """A running task whose holder's lease ended a minute ago."""
    from datetime import timedelta

    from chongming_task import TaskSnapshot

    past = datetime.now(UTC) - timedelta(minutes=1)
    store.create(
        TaskSnapshot(
            task_id="t",
            name="n",
            status=S.RUNNING,
            status_version=3,
            created_at=past,
            lease_owner="slow-node",
            lease_until=past,
        )
    )


def test_reconcile_lets_go_when_the_holder_finishes_at_the_same_moment() -> None:
    """Reconcile's save is a compare-and-set: if the holder writes first (the task was
    finishing, not dead), reconcile gets a conflict and lets go; it never overwrites."""
    from dataclasses import replace

    from chongming_task import TaskSnapshot

    class RacingStore(InMemoryTaskStore):
        def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
            if snapshot.status is S.LOST:  # the holder's final write lands just before
                current = self.get(snapshot.task_id)
                assert current is not None
                done = replace(current, status=S.SUCCEEDED, status_version=expect_version + 1)
                super().save(done, expect_version=expect_version)
            super().save(snapshot, expect_version=expect_version)

    inner = RacingStore()
    store = core_only(inner)  # reconcile's fallback: read, then a save per task
    _create_expired(store)
    c = Controller(store)
    report = c.reconcile()
    assert report.lost == () and report.let_go == ("t",)
    assert store.get("t").status is S.SUCCEEDED  # type: ignore[union-attr]
    assert store.history("t") == []  # reconcile appended nothing
    c.close()


def test_reconcile_in_the_store_leaves_a_task_its_holder_finished_meanwhile() -> None:
    """The same race where the store marks the expired itself (``Maintenance``): the
    holder's write between the scan and the mark wins, and nothing is marked."""
    from dataclasses import replace

    from chongming_task.stores.roles import Creation

    class RacingStore(InMemoryTaskStore):
        def mark_lost(self, marks: list[Creation]) -> set[str]:  # type: ignore[override]
            for marked, _ in marks:  # each holder's final write lands just before
                current = self.get(marked.task_id)
                assert current is not None
                done = replace(
                    current, status=S.SUCCEEDED, status_version=current.status_version + 1
                )
                self.save(done, expect_version=current.status_version)
            return super().mark_lost(marks)

    store = RacingStore()
    _create_expired(store)
    c = Controller(store)
    report = c.reconcile()
    assert report.lost == ()
    assert store.get("t").status is S.SUCCEEDED  # type: ignore[union-attr]
    assert store.history("t") == []
    c.close()


def test_serve_keeps_the_node_until_told_then_closes_it(make_controller: Make) -> None:
    """``serve(until=...)`` from a thread: the node keeps running (its schedule fires),
    then closes once the event is set, its running task stopped."""
    from chongming_task import IntervalTrigger, TaskQuery

    c = make_controller(InMemoryTaskStore(), max_workers=2)
    started = threading.Event()
    c.task(looping, name="loop")
    c.task(lambda token: None, name="tick")
    run = c.tasks["loop"].submit(started)
    c.schedule("often", "tick", IntervalTrigger(0.05))
    until = threading.Event()
    ended: list[str] = []
    server = threading.Thread(target=lambda: ended.append(c.serve(until)))
    server.start()
    assert started.wait(10)
    fired = TaskQuery(tag="schedule:often")
    wait_until(lambda: len(c.list_tasks(fired)) >= 2, 10, "two firings")
    assert server.is_alive()
    until.set()
    server.join(15)
    assert ended == ["until"]
    assert run.snapshot().status is S.STOPPED
    with pytest.raises(ControllerClosed):
        c.tasks["tick"].submit()


def test_serve_off_the_main_thread_needs_an_event(make_controller: Make) -> None:
    c = make_controller(InMemoryTaskStore())
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            c.serve()
        except ConfigurationError as exc:
            failed.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join(10)
    assert len(failed) == 1 and "until=" in str(failed[0])
    c.submit(c.task(lambda token: None, name="still")).wait(10)  # still open
