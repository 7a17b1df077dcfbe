"""``current()`` and the log records made while a task runs: each names its task, in
thread and ``async def`` tasks alike, attempt by attempt; records made elsewhere are left
as they are. (The node's own line about a task it carries: test_async_tasks.py's
swallowed cancellation.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    CurrentTask,
    RetryPolicy,
    TaskStatus,
    current,
)

Make = Callable[..., Controller]
log = logging.getLogger("tests.current")


def named(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def test_a_thread_task_knows_itself_and_its_log_records_name_it(
    make_controller: Make, caplog: pytest.LogCaptureFixture
) -> None:
    c = make_controller(owned_buckets=[3], num_buckets=8)
    seen: list[CurrentTask | None] = []

    @c.task(name="flaky", retries=1, backoff=RetryPolicy(base_delay=0.001, jitter=0.0))
    def flaky(token: CancellationToken) -> str:
        me = current()
        seen.append(me)
        log.warning("working on it")
        if me is not None and me.attempt == 1:
            raise ValueError("first try fails")
        return "done"

    key = next(f"k{i}" for i in range(1000) if c.bucket_policy.bucket_for(f"k{i}") == 3)
    with caplog.at_level(logging.INFO):
        run = c.tasks["flaky"].configure(bucket_key=key).submit()
        assert run.wait(timeout=10).status is TaskStatus.SUCCEEDED
        log.warning("outside any task")
    assert seen == [
        CurrentTask(task_id=run.task_id, name="flaky", attempt=1, bucket=3),
        CurrentTask(task_id=run.task_id, name="flaky", attempt=2, bucket=3),
    ]
    inside = named(caplog, "working on it")
    assert [(r.task_id, r.task_name, r.attempt) for r in inside] == [  # type: ignore[attr-defined]
        (run.task_id, "flaky", 1),
        (run.task_id, "flaky", 2),
    ]
    (outside,) = named(caplog, "outside any task")
    assert not hasattr(outside, "task_id")
    assert current() is None


def test_async_tasks_on_one_loop_each_see_their_own(
    make_controller: Make, caplog: pytest.LogCaptureFixture
) -> None:
    c = make_controller()
    seen: dict[str, list[str | None]] = {}

    @c.task(name="interleaved")
    async def interleaved(token: CancellationToken, label: str) -> None:
        for _ in range(3):
            me = current()
            seen.setdefault(label, []).append(me.task_id if me else None)
            log.warning("step of %s", label)
            await asyncio.sleep(0.01)  # the other task runs meanwhile

    with caplog.at_level(logging.INFO):
        runs = {label: c.tasks["interleaved"].submit(label) for label in ("a", "b")}
        for run in runs.values():
            assert run.wait(timeout=10).status is TaskStatus.SUCCEEDED
    assert seen == {label: [run.task_id] * 3 for label, run in runs.items()}
    for label, run in runs.items():
        records = named(caplog, f"step of {label}")
        assert len(records) == 3
        assert {(r.task_id, r.task_name, r.attempt) for r in records} == {  # type: ignore[attr-defined]
            (run.task_id, "interleaved", 1)
        }


def test_a_format_string_can_name_the_task_with_defaults_for_other_lines(
    make_controller: Make,
) -> None:
    c = make_controller()
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect()
    handler.setFormatter(
        logging.Formatter(
            "%(task_name)s#%(attempt)s %(message)s", defaults={"task_name": "-", "attempt": 0}
        )
    )
    log.addHandler(handler)
    try:

        @c.task(name="says")
        def says(token: CancellationToken) -> None:
            log.warning("hello")

        assert c.tasks["says"].submit().wait(timeout=10).status is TaskStatus.SUCCEEDED
        log.warning("bye")
    finally:
        log.removeHandler(handler)
    assert lines == ["says#1 hello", "-#0 bye"]
