"""Which failures are retried (``retry_on``, ``give_up_on``), a task that asks to run
again later without counting a failure (``raise Retry(after=...)``), and Celery's words
answered with ours."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    ConfigurationError,
    FailureKind,
    InvalidValue,
    Retry,
    RetryPolicy,
    TaskStatus,
    current,
)
from chongming_task.model import TaskQuery
from tests.conftest import wait_until
from tests.unit.test_controller import FAST, Make, statuses

S = TaskStatus


def _reasons(make: Any, task_id: str) -> list[str]:
    return [t.reason or "" for t in make.history(task_id)]


def test_only_the_exceptions_of_retry_on_are_retried(make_controller: Make) -> None:
    c = make_controller()

    @c.task(name="fetch", retries=3, backoff=FAST, retry_on=(ConnectionError, TimeoutError))
    def fetch(token: CancellationToken, error: str) -> None:
        raise {"connection": ConnectionError, "value": ValueError}[error]("no")

    flaky = c.submit(fetch, "connection").wait(5)
    assert flaky.status is S.FAILED and flaky.attempt == 4  # the first and three retries
    broken = fetch.submit("value").wait(5)
    assert broken.status is S.FAILED and broken.attempt == 1  # never worth another
    assert statuses(c, broken.task_id)[-2:] == [S.RUNNING, S.FAILED]
    assert _reasons(c, broken.task_id)[-1] == (
        "ValueError: no (not retried: ValueError is none of retry_on)"
    )


def test_give_up_on_fails_at_once_what_would_otherwise_be_retried(make_controller: Make) -> None:
    c = make_controller()

    @c.task(name="parse", retries=3, backoff=FAST, give_up_on=ValueError)
    def parse(token: CancellationToken, error: str) -> None:
        raise {"key": KeyError, "value": ValueError}[error]("bad")

    assert parse.submit("key").wait(5).attempt == 4
    final = parse.submit("value").wait(5)
    assert final.status is S.FAILED and final.attempt == 1
    assert final.failure is not None and final.failure.kind is FailureKind.EXCEPTION
    assert _reasons(c, final.task_id)[-1].endswith("(not retried: ValueError is one of give_up_on)")


def test_a_retry_asked_for_runs_again_later_without_counting_a_failure(
    make_controller: Make,
) -> None:
    c = make_controller()

    @c.task(name="poll", retries=0)
    def poll(token: CancellationToken) -> int:
        here = current()
        assert here is not None
        if here.attempt < 3:
            raise Retry(after=0.05, reason="the report is not ready")
        return here.attempt

    run = poll.submit()
    final = run.wait(5)
    assert final.status is S.SUCCEEDED and run.result() == 3 and final.failure is None
    asked = [r for r in _reasons(c, run.task_id) if r.startswith("asked to run again")]
    assert asked == ["asked to run again in 0.05s: the report is not ready"] * 2
    trail = c.history(run.task_id)
    again = [t for t in trail if t.reason in asked]
    following = [trail[trail.index(t) + 1] for t in again]
    # Not before its time: each next start is at least 0.05 s after the ask.
    assert all((f.at - t.at).total_seconds() >= 0.05 for t, f in zip(again, following, strict=True))


def test_a_retry_asked_for_leaves_the_failures_budget_as_it_was(make_controller: Make) -> None:
    c = make_controller()

    @c.task(name="mixed", retries=1, backoff=FAST)
    def mixed(token: CancellationToken) -> None:
        here = current()
        assert here is not None
        if here.attempt == 1:
            raise Retry()  # counts nothing
        raise ConnectionError(f"attempt {here.attempt}")  # 2: the one retry; 3: the end

    final = mixed.submit().wait(5)
    assert final.status is S.FAILED and final.attempt == 3
    assert final.failure is not None and final.failure.message == "ConnectionError: attempt 3"


def test_a_retry_asked_for_in_an_async_task(make_controller: Make) -> None:
    c = make_controller()

    @c.task(name="later")
    async def later(token: CancellationToken) -> int:
        here = current()
        assert here is not None
        await asyncio.sleep(0)
        if here.attempt == 1:
            raise Retry(after=0.01)
        return here.attempt

    assert later.submit().result(5) == 2


def test_a_stop_asked_while_a_retry_was_raised_wins(make_controller: Make) -> None:
    c = make_controller()

    @c.task(name="stubborn")
    def stubborn(token: CancellationToken) -> None:
        token.checkpoint()
        while not token.stop_requested:
            pass
        raise Retry(after=60)

    run = stubborn.submit()
    wait_until(lambda: run.status is S.RUNNING, what="running")
    run.stop()
    assert run.wait(5).status is S.STOPPED


@pytest.mark.parametrize(
    ("made", "message"),
    [
        (lambda: Retry(after=-1), "Retry(after=...) takes seconds from 0"),
        (lambda: Retry(after="soon"), "Retry(after=...) takes seconds from 0"),  # type: ignore[arg-type]
        (lambda: Retry(after=float("nan")), "Retry(after=...) takes seconds from 0"),
        (lambda: Retry(after=1, reason=42), "Retry(reason=...) takes text"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_retry_is_refused_where_it_is_made(made: Any, message: str) -> None:
    with pytest.raises(InvalidValue, match=message.replace("(", r"\(").replace(")", r"\)")):
        made()


def test_what_retry_on_and_give_up_on_take_is_checked_at_definition(
    make_controller: Make,
) -> None:
    c = make_controller()
    for bad in ("ValueError", ValueError("x"), (ValueError, 3), KeyboardInterrupt):
        with pytest.raises(ConfigurationError, match="takes exception classes"):
            c.task(lambda token: None, name="bad", retry_on=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="give_up_on takes exception classes"):
        RetryPolicy(give_up_on=(int,))  # type: ignore[arg-type]
    policy = RetryPolicy(retries=2, give_up_on=KeyError)  # one class alone is allowed
    assert policy.give_up_on == (KeyError,) and not policy.retries_on(KeyError())


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda t: t.delay(1), "Task has no 'delay' (Celery's delay: here submit(*args"),
        (lambda t: t.apply_async((1,)), "(Celery's apply_async: here configure(delay=..."),
        (lambda t: t.configure(priority=1).delay(1), "ConfiguredTask has no 'delay'"),
        (lambda t: t.submit(1, countdown=5), "(Celery's countdown: here delay= (seconds"),
        (lambda t: t.configure(countdown=5), "does not take: countdown (Celery's countdown"),
        (lambda t: t.configure(priority=1).configure(eta=0), "eta (Celery's eta: here run_at="),
    ],
)
def test_celery_words_are_answered_with_ours(make_controller: Make, call: Any, said: str) -> None:
    c = make_controller()
    add = c.task(lambda token, x: x, name="add")
    with pytest.raises((AttributeError, TypeError)) as raised:
        call(add)
    assert said in str(raised.value)
    assert c.store.query(TaskQuery()) == []  # nothing was submitted
