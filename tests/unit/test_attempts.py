"""An attempt's end through the Controller: retries and their backoff, results, timeouts
(a task that obeys, one that ignores them, paused time), and the activity a task
reports reaching the store."""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    ConfigurationError,
    FailureKind,
    InMemoryTaskStore,
    Progress,
    RetryPolicy,
    TaskStore,
)
from chongming_task.definitions import define
from chongming_task.present import show_text
from chongming_task.run import TaskRun
from chongming_task.run.writes import RunWrites
from chongming_task.testing import FakeClock, FaultyStore
from tests.conftest import here, wait_until
from tests.unit.test_controller import FAST, Make, S, looping, statuses


def test_retries_with_backoff_then_success(store: TaskStore, make_controller: Make) -> None:
    c = make_controller(store)
    calls: list[int] = []

    @c.task(name="flaky", retries=3, backoff=FAST)
    def flaky(token: CancellationToken) -> str:
        calls.append(here().attempt)
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


def test_the_retry_count_is_given_once(make_controller: Make) -> None:
    """``retries=`` or a ``RetryPolicy`` counts the retries; given both, they agree, or
    the policy gives the shape alone (its own count 0)."""

    def work(token: CancellationToken) -> None:
        return None

    assert define(work, backoff=RetryPolicy(retries=5)).retry.retries == 5
    shaped = define(work, retries=3, backoff=RetryPolicy(base_delay=2.0))
    assert (shaped.retry.retries, shaped.retry.base_delay) == (3, 2.0)
    assert define(work, retries=5, backoff=RetryPolicy(retries=5)).retry.retries == 5
    assert define(work).retry.retries == 0
    with pytest.raises(ConfigurationError, match="retries=2 disagrees with"):
        define(work, retries=2, backoff=RetryPolicy(retries=5))
    # And the node runs what the policy counts: two retries, three attempts.
    c = make_controller()
    tries: list[int] = []

    @c.task(name="twice", backoff=dataclasses.replace(FAST, retries=2))
    def twice(token: CancellationToken) -> None:
        tries.append(here().attempt)
        raise ConnectionError("again")

    run = c.submit(twice)
    assert run.wait(timeout=10).status is S.FAILED
    assert tries == [1, 2, 3]


def test_a_retry_starts_with_the_activity_its_last_attempt_reported(
    store: TaskStore, make_controller: Make
) -> None:
    c = make_controller(store)
    second = threading.Event()
    release = threading.Event()

    @c.task(name="reports_then_fails", retries=1, backoff=FAST)
    def reports_then_fails(token: CancellationToken) -> str:
        if here().attempt == 1:
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
        if here().attempt == 1:
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
        # Reported at 3 of 10; a success says it is complete.
        assert seen.progress == Progress(current=10, total=10, message="three")
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
        raise ValueError(f"attempt {here().attempt}")

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
    shown = show_text(final, datetime.now(UTC))  # said once, by the message itself
    assert shown.count("may still be running") == 1 and "its carrier may" not in shown
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


@pytest.mark.parametrize(
    ("last", "said"),
    [
        (
            Progress(current=19, total=20, message="page 19"),
            Progress(current=20, total=20, message="page 19"),
        ),
        (Progress(current=7), Progress(current=7, total=7)),
        (Progress(current=20, total=20), Progress(current=20, total=20)),
    ],
    ids=["short-of-its-total", "open-ended", "already-complete"],
)
def test_a_success_says_its_progress_is_complete_in_the_store_and_the_handle(
    make_controller: Make, last: Progress, said: Progress
) -> None:
    c = make_controller()

    @c.task(name="pages")
    def pages(token: CancellationToken) -> str:
        token.checkpoint(last)
        return "done"

    run = c.submit(pages)
    assert run.wait(5).status is S.SUCCEEDED
    assert run.progress == said and run.snapshot().progress == said
    assert c.get(run.task_id).progress == said


def test_a_failure_keeps_the_progress_it_reached(make_controller: Make) -> None:
    c = make_controller()

    @c.task(name="pages", retries=0)
    def pages(token: CancellationToken) -> None:
        token.checkpoint(Progress(current=19, total=20))
        raise ValueError("page 20 is missing")

    run = c.submit(pages)
    assert run.wait(5).status is S.FAILED
    assert c.get(run.task_id).progress == Progress(current=19, total=20)


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
