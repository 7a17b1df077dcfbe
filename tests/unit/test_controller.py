"""The core runtime through the Controller: lifecycle, control, retries, timeouts."""

from __future__ import annotations

import dataclasses
import gc
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    ConfigurationError,
    Controller,
    ControllerClosed,
    FailureKind,
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
from chongming_task.run import TaskRun
from chongming_task.run.writes import RunWrites
from chongming_task.testing import FakeClock, FaultyStore
from tests.conftest import wait_until

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
    assert not gc.is_tracked(run.writes.trail)
    if isinstance(store, InMemoryTaskStore):
        assert not gc.is_tracked(store._history[run.task_id])
    assert statuses(c, run.task_id) == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]
    assert c.history(run.task_id) == run.history()
    assert [t.reason for t in run.history()][1] == "attempt 1"


def test_submit_by_name_and_unknown_names(make_controller: Make) -> None:
    c = make_controller()
    c.task(lambda token: "hi", name="hello")
    assert c.submit("hello").result(5) == "hi"
    with pytest.raises(UnknownTask, match="nope"):
        c.submit("nope")


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
        with run.token._lock:
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


def test_retries_with_backoff_then_success(store: TaskStore, make_controller: Make) -> None:
    c = make_controller(store)
    calls: list[int] = []

    @c.task(name="flaky", retries=3, backoff=FAST)
    def flaky(token: CancellationToken) -> str:
        calls.append(token.attempt)
        if len(calls) < 3:
            raise ConnectionError(f"boom {len(calls)}")
        return "ok"

    run = c.submit(flaky)
    assert run.result(5) == "ok"
    assert calls == [1, 2, 3]
    final = c.get(run.task_id)
    assert final.attempt == 3 and final.failure is None
    history = c.history(run.task_id)
    retries = [t for t in history if t.to_status is S.QUEUED and t.from_status is S.RUNNING]
    assert len(retries) == 2
    assert retries[0].reason is not None and "retry 1/3" in retries[0].reason
    assert "ConnectionError: boom 1" in retries[0].reason


def test_a_retry_starts_with_the_activity_its_last_attempt_reported(
    store: TaskStore, make_controller: Make
) -> None:
    c = make_controller(store)
    second = threading.Event()
    release = threading.Event()

    @c.task(name="reports_then_fails", retries=1, backoff=FAST)
    def reports_then_fails(token: CancellationToken) -> str:
        if token.attempt == 1:
            token.checkpoint(Progress(current=3, total=10, message="three"))
            raise ConnectionError("boom")
        second.set()
        release.wait(5)
        return "ok"

    run = c.submit(reports_then_fails)
    assert second.wait(5)
    try:
        # The second attempt's start, as written (a writer thread may still be writing
        # it as the function runs): running, and the progress kept.
        wait_until(lambda: c.get(run.task_id).status is S.RUNNING, what="start written")  # type: ignore[union-attr]
        started = c.get(run.task_id)
        assert started is not None and started.status is S.RUNNING and started.attempt == 2
        assert started.progress == Progress(current=3, total=10, message="three")
        assert started.last_heartbeat_at is not None and started.started_at is not None
        assert started.last_heartbeat_at <= started.started_at
    finally:
        release.set()
    assert run.result(5) == "ok"


def test_a_success_is_written_with_its_outcome_and_what_the_task_reported(
    store: TaskStore, make_controller: Make
) -> None:
    c = make_controller(store)

    @c.task(name="reports_then_returns")
    def reports_then_returns(token: CancellationToken) -> dict[str, int]:
        token.checkpoint(Progress(current=3, total=10, message="three"))
        return {"n": 1}

    @c.task(name="fails_once", retries=1, backoff=FAST)
    def fails_once(token: CancellationToken) -> str:
        if token.attempt == 1:
            raise ConnectionError("boom")
        return "ok"

    reported = c.submit(reports_then_returns)
    retried = c.submit(fails_once)
    for run in (reported, retried):
        final = run.wait(5)
        stored = c.get(run.task_id)
        assert stored is not None
        for seen in (final, stored):
            assert seen.status is S.SUCCEEDED and seen.ended_at is not None
            assert seen.status_version == final.status_version
            assert seen.failure is None  # a retry's success clears the last attempt's
        trail = c.history(run.task_id)
        assert (trail[-1].from_status, trail[-1].to_status) == (S.RUNNING, S.SUCCEEDED)
        assert trail[-1].at == final.ended_at and trail[-1].version == final.status_version
    done = reported.wait(5)
    assert done.outcome == {"n": 1} and c.get(reported.task_id).outcome == {"n": 1}  # type: ignore[union-attr]
    for seen in (done, c.get(reported.task_id)):
        assert seen is not None
        assert seen.progress == Progress(current=3, total=10, message="three")
        assert seen.last_heartbeat_at is not None
    assert retried.wait(5).attempt == 2 and retried.result(5) == "ok"


def test_the_start_and_success_moves_make_what_the_general_move_makes(
    store: TaskStore, make_controller: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``RunWrites.start`` and ``succeed`` make an attempt's two common moves without
    ``move``'s dict of changes, for speed. Run the same task both ways on one frozen
    clock; the snapshot and the trail, in memory and stored, must not tell them apart."""
    c = make_controller(store, clock=FakeClock())
    job = c.task(lambda token: {"n": 1}, name="returns")

    def finished(run: TaskRun) -> tuple[object, ...]:
        final = run.wait(5)
        stored = c.get(run.task_id)
        assert final.status is S.SUCCEEDED and stored == final

        def anonymous(record: Any) -> Any:
            return dataclasses.replace(record, task_id="-")

        trails = (c.history(run.task_id), run.history())
        return anonymous(final), *([anonymous(t) for t in trail] for trail in trails)

    fast = finished(c.submit(job))

    def start(self: RunWrites, attempt_no: int, reason: str) -> None:
        steps = ((S.STARTING, reason), (S.RUNNING, None))
        self.move(steps, None, {"attempt": attempt_no}, stamp=("started_at",))

    def succeed(self: RunWrites, outcome: object) -> None:
        self.move(((S.SUCCEEDED, None),), None, {"outcome": outcome, "failure": None})

    monkeypatch.setattr(RunWrites, "start", start)
    monkeypatch.setattr(RunWrites, "succeed", succeed)
    general = finished(c.submit(job))
    assert fast == general


def test_retries_exhausted_fail_with_the_last_exception(make_controller: Make) -> None:
    c = make_controller()

    @c.task(name="bad", retries=2, backoff=FAST)
    def bad(token: CancellationToken) -> None:
        raise ValueError(f"attempt {token.attempt}")

    final = c.submit(bad).wait(5)
    assert final.status is S.FAILED and final.attempt == 3
    assert final.failure is not None and final.failure.kind is FailureKind.EXCEPTION
    assert final.failure.message == "ValueError: attempt 3"
    assert final.failure.exception_type == "builtins.ValueError"


def test_backoff_delays_grow_exponentially_with_bounded_jitter() -> None:
    import random

    policy = RetryPolicy(retries=5, base_delay=1.0, factor=2.0, max_delay=5.0, jitter=0.1)
    rng = random.Random(7)
    for retry, expected in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (5, 5.0)]:
        delay = policy.delay(retry, rng)
        assert expected * 0.9 <= delay <= expected * 1.1, (retry, delay)
    assert RetryPolicy(jitter=0.0, base_delay=0.5).delay(1) == 0.5


@pytest.mark.parametrize(
    "result", [object(), {"when": threading.Event()}, float("nan"), {1: {2, 3}}]
)
def test_a_non_json_result_fails_as_result_invalid_without_retry(
    store: TaskStore, make_controller: Make, result: Any
) -> None:
    """docs/design.md, "Results": an unserializable result once left the store at
    ``running`` while the process said ``succeeded``; reconcile then killed a task that
    had really succeeded. It must fail, in memory and in the store, and never retry."""
    c = make_controller(store)
    calls: list[int] = []

    @c.task(name="weird", retries=3, backoff=FAST)
    def weird(token: CancellationToken) -> Any:
        calls.append(1)
        return result

    run = c.submit(weird)
    final = run.wait(5)
    assert final.status is S.FAILED and calls == [1]
    assert final.failure is not None and final.failure.kind is FailureKind.RESULT_INVALID
    stored = c.get(run.task_id)
    assert stored.status is S.FAILED and stored.status_version == 4
    assert stored.failure is not None and stored.failure.kind is FailureKind.RESULT_INVALID
    assert statuses(c, run.task_id) == [S.QUEUED, S.STARTING, S.RUNNING, S.FAILED]


def test_stop_is_never_retried(make_controller: Make) -> None:
    c = make_controller()
    started = threading.Event()
    run = c.submit(c.task(looping, name="loop", retries=5, backoff=FAST), started)
    assert started.wait(5)
    c.stop(run.task_id)
    final = run.wait(5)
    assert final.status is S.STOPPED and final.attempt == 1


def test_timeout_asks_the_task_to_stop_and_fails_it_as_timeout(make_controller: Make) -> None:
    c = make_controller()
    run = c.submit(c.task(looping, name="slow", timeout=0.05, retries=2, backoff=FAST))
    final = run.wait(5)
    assert final.status is S.FAILED and final.attempt == 1
    assert final.failure is not None and final.failure.kind is FailureKind.TIMEOUT
    assert final.failure.carrier_may_run is False
    assert statuses(c, run.task_id)[-2:] == [S.STOPPING, S.FAILED]


def test_a_timed_out_task_that_ignores_stop_is_failed_and_its_carrier_replaced(
    make_controller: Make,
) -> None:
    c = make_controller(max_workers=1)
    release = threading.Event()

    @c.task(name="stubborn", timeout=0.05, timeout_grace=0.05)
    def stubborn(token: CancellationToken) -> str:
        release.wait(10)  # never checkpoints
        return "late"

    run = c.submit(stubborn)
    final = run.wait(5)
    assert final.status is S.FAILED
    assert final.failure is not None and final.failure.kind is FailureKind.TIMEOUT
    assert final.failure.carrier_may_run is True
    assert "may still be running" in final.failure.message
    # The only worker is stuck in stubborn(), yet new work runs on a replacement carrier.
    assert c.submit(c.task(lambda token: 1, name="next")).result(5) == 1
    release.set()
    wait_until(lambda: threading.active_count() < 100)
    assert c.get(run.task_id).status is S.FAILED  # the late result is not recorded
    assert c.get(run.task_id).outcome is None


def test_paused_time_does_not_count_against_the_timeout(make_controller: Make) -> None:
    c = make_controller()
    started = threading.Event()
    run = c.submit(c.task(looping, name="loop", timeout=0.3), started)
    assert started.wait(5)
    c.pause(run.task_id)
    wait_until(lambda: run.status is S.PAUSED)
    threading.Event().wait(0.5)  # longer than the timeout, but paused
    assert run.status is S.PAUSED
    c.resume(run.task_id)
    final = run.wait(5)
    assert final.failure is not None and final.failure.kind is FailureKind.TIMEOUT


def test_progress_and_heartbeat_reach_the_store_through_touch_not_save(
    make_controller: Make,
) -> None:
    inner = InMemoryTaskStore()
    store = FaultyStore(inner)
    c = make_controller(store)
    go_on = threading.Event()

    @c.task(name="progress")
    def work(token: CancellationToken) -> None:
        token.checkpoint(Progress(current=3, total=10, message="three"))
        go_on.wait(5)

    run = c.submit(work)
    wait_until(
        lambda: (p := inner.get(run.task_id)) is not None and p.progress is not None,
        what="progress in store",
    )
    stored = c.get(run.task_id)
    assert stored.progress == Progress(current=3, total=10, message="three")
    assert stored.last_heartbeat_at is not None
    assert stored.status_version == 3  # touch never bumps the version
    saves_before = store.calls.get("save", 0)
    assert store.calls.get("touch", 0) >= 1
    go_on.set()
    run.wait(5)
    assert store.calls["save"] == saves_before + 1  # only the final transition saved


def test_a_save_never_writes_an_older_heartbeat_than_touch_did(make_controller: Make) -> None:
    """refresh_activity: the heartbeat ``touch`` wrote must survive the next ``save``."""
    store = InMemoryTaskStore()
    c = make_controller(store)
    go_on = threading.Event()

    @c.task(name="hb")
    def work(token: CancellationToken) -> None:
        token.checkpoint()
        go_on.wait(5)

    run = c.submit(work)
    wait_until(
        lambda: (s := store.get(run.task_id)) is not None and s.last_heartbeat_at is not None
    )
    touched = store.get(run.task_id)
    assert touched is not None
    c.pause(run.task_id)  # a save while the task does not checkpoint
    after = store.get(run.task_id)
    assert after is not None and after.status is S.PAUSING
    assert after.last_heartbeat_at == touched.last_heartbeat_at
    go_on.set()
    run.wait(5)


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
        c.submit(job, bucket_key=theirs)
    run = c.submit(job, bucket_key=mine)
    assert run.wait(5).bucket == c.bucket_policy.bucket_for(mine)
    assert c.get(run.task_id).bucket_key == mine
    everything = make_controller(owned_buckets=range(64))
    assert everything.owns_all_buckets
    assert everything.submit(job).result(5) == 1  # no partition: no bucket_key needed


def test_reconcile_lets_go_when_the_holder_finishes_at_the_same_moment() -> None:
    """Reconcile's save is a compare-and-set: if the holder writes first (the task was
    finishing, not dead), reconcile gets a conflict and lets go; it never overwrites."""
    from dataclasses import replace
    from datetime import timedelta

    from chongming_task import TaskSnapshot

    class RacingStore(InMemoryTaskStore):
        def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
            if snapshot.status is S.LOST:  # the holder's final write lands just before
                current = self.get(snapshot.task_id)
                assert current is not None
                done = replace(current, status=S.SUCCEEDED, status_version=expect_version + 1)
                super().save(done, expect_version=expect_version)
            super().save(snapshot, expect_version=expect_version)

    store = RacingStore()
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
    c = Controller(store)
    report = c.reconcile()
    assert report.lost == () and report.let_go == ("t",)
    assert store.get("t").status is S.SUCCEEDED  # type: ignore[union-attr]
    assert store.history("t") == []  # reconcile appended nothing
    c.close()


def test_serve_keeps_the_node_until_told_then_closes_it(make_controller: Make) -> None:
    """``serve(until=...)`` from a thread: the node keeps running (its schedule fires),
    then closes once the event is set, its running task stopped."""
    from chongming_task import IntervalTrigger, TaskQuery

    c = make_controller(InMemoryTaskStore(), max_workers=2)
    started = threading.Event()
    c.task(looping, name="loop")
    c.task(lambda token: None, name="tick")
    run = c.submit("loop", started)
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
        c.submit("tick")


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
