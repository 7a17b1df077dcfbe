"""``async def`` tasks: run on the node's event loop beside thread tasks, with the
awaited token (``acheckpoint``, ``asleep``), stops and timeouts that really cancel, and
the async faces of the node and the run."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    FailureKind,
    InvalidValue,
    Progress,
    TaskStatus,
    TaskStore,
    TaskUnsuccessful,
)
from tests.conftest import wait_until

S = TaskStatus
Make = Callable[..., Controller]


def test_async_and_sync_tasks_share_a_node(store: TaskStore, make_controller: Make) -> None:
    c = make_controller(store)

    @c.task(name="double")
    async def double(token: CancellationToken, n: int) -> int:
        await asyncio.sleep(0.01)
        await token.acheckpoint(Progress(current=1, total=1))
        return n * 2

    @c.task(name="triple")
    def triple(token: CancellationToken, n: int) -> int:
        return n * 3

    runs = [c.tasks["double"].submit(n) for n in range(20)] + [c.tasks["triple"].submit(5)]
    assert [r.result(timeout=10) for r in runs] == [n * 2 for n in range(20)] + [15]
    stored = store.get(runs[0].task_id)
    assert stored is not None and stored.status is S.SUCCEEDED and stored.outcome == 0
    assert stored.progress == Progress(current=1, total=1)


def test_many_async_tasks_run_at_once_on_one_loop(make_controller: Make) -> None:
    c = make_controller(max_workers=2)

    @c.task(name="nap")
    async def nap(token: CancellationToken) -> str:
        await token.asleep(0.5)
        return "rested"

    started = time.monotonic()
    runs = [c.tasks["nap"].submit() for _ in range(200)]
    assert all(r.result(timeout=30) == "rested" for r in runs)
    # Two worker threads, 200 naps of 0.5 s: together, not one after another.
    assert time.monotonic() - started < 10


def test_a_stop_wakes_asleep_at_once(store: TaskStore, make_controller: Make) -> None:
    c = make_controller(store)

    @c.task(name="long")
    async def long(token: CancellationToken) -> None:
        await token.asleep(60)

    run = c.tasks["long"].submit()
    wait_until(lambda: run.status is S.RUNNING)
    asked = time.monotonic()
    c.stop(run.task_id)
    assert run.wait(timeout=10).status is S.STOPPED
    assert time.monotonic() - asked < 2


def test_pause_and_resume_an_async_task(make_controller: Make) -> None:
    c = make_controller()
    steps: list[int] = []

    @c.task(name="steps")
    async def stepper(token: CancellationToken) -> int:
        for i in range(200):
            steps.append(i)
            await token.asleep(0.01)
        return len(steps)

    run = c.tasks["steps"].submit()
    wait_until(lambda: len(steps) > 3)
    c.pause(run.task_id)
    wait_until(lambda: run.status is S.PAUSED, what="paused at an awaited checkpoint")
    held = len(steps)
    time.sleep(0.2)
    assert len(steps) <= held + 1  # it waits, and the loop is not blocked meanwhile
    c.resume(run.task_id)
    assert run.result(timeout=20) == 200
    trail = [t.to_status for t in c.history(run.task_id)]
    assert trail[-4:] == [S.PAUSING, S.PAUSED, S.RUNNING, S.SUCCEEDED]


def test_a_timeout_cancels_the_coroutine_for_real(store: TaskStore, make_controller: Make) -> None:
    c = make_controller(store)
    cancelled: list[bool] = []

    @c.task(name="stuck", timeout=0.3, timeout_grace=30)
    async def stuck(token: CancellationToken) -> None:
        try:
            await asyncio.sleep(60)  # never checks its token
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    run = c.tasks["stuck"].submit()
    final = run.wait(timeout=10)  # long before the 30 s grace
    assert cancelled == [True]
    assert final.status is S.FAILED and final.failure is not None
    assert final.failure.kind is FailureKind.TIMEOUT
    assert final.failure.carrier_may_run is False  # it cannot run on
    assert "cancelled at an await" in final.failure.message
    assert "checkpoint" not in final.failure.message


def test_a_stop_whose_grace_runs_out_cancels(make_controller: Make) -> None:
    c = make_controller()

    @c.task(name="deaf", timeout_grace=0.2)
    async def deaf(token: CancellationToken) -> None:
        await asyncio.sleep(60)

    run = c.tasks["deaf"].submit()
    wait_until(lambda: run.status is S.RUNNING)
    c.stop(run.task_id)
    final = run.wait(timeout=10)
    assert final.status is S.STOPPED and final.failure is None
    assert c.history(run.task_id)[-1].reason == "cancelled at an await"


class Refuser:
    """An ``async def`` task that catches every cancellation and goes on awaiting, until
    the test lets it go (so no coroutine outlives the test)."""

    def __init__(self) -> None:
        self.released = False
        self.cancellations = 0
        self.ended = False

    async def run(self, token: CancellationToken) -> str:
        try:
            while not self.released:
                try:
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:
                    self.cancellations += 1
            return "let go"
        finally:
            self.ended = True


def test_a_coroutine_that_refuses_every_cancellation_ends_stopped_after_the_grace(
    make_controller: Make,
) -> None:
    c = make_controller()
    refuser = Refuser()
    c.task(name="refuser", timeout_grace=0.2)(refuser.run)
    run = c.tasks["refuser"].submit()
    wait_until(lambda: run.status is S.RUNNING)
    c.stop(run.task_id)
    final = run.wait(timeout=15)
    assert refuser.cancellations >= 1 and not refuser.ended  # it is still running
    assert final.status is S.STOPPED and final.failure is not None
    assert final.failure.kind is FailureKind.ABANDONED
    assert final.failure.carrier_may_run is True
    assert "coroutine refused cancellation" in final.failure.message
    assert "thread" not in final.failure.message
    assert c.history(run.task_id)[-1].reason == "stop; carrier abandoned"
    assert c.store.get(run.task_id) == final  # written, as the run says
    refuser.released = True
    wait_until(lambda: refuser.ended, what="the coroutine let go")
    assert run.snapshot() == final  # its late return changes nothing


def test_a_coroutine_that_refuses_its_timeouts_cancellation_names_the_coroutine(
    make_controller: Make,
) -> None:
    c = make_controller()
    refuser = Refuser()
    c.task(name="refuser", timeout=0.2, timeout_grace=0.3)(refuser.run)
    run = c.tasks["refuser"].submit()
    final = run.wait(timeout=15)
    assert final.status is S.FAILED and final.failure is not None
    assert final.failure.kind is FailureKind.TIMEOUT and final.failure.carrier_may_run
    assert "coroutine refused cancellation" in final.failure.message
    assert "thread" not in final.failure.message
    refuser.released = True
    wait_until(lambda: refuser.ended, what="the coroutine let go")


def test_close_returns_within_its_timeout_and_says_what_it_left(
    make_controller: Make, caplog: pytest.LogCaptureFixture
) -> None:
    c = make_controller()
    refuser = Refuser()
    c.task(name="refuser")(refuser.run)  # the default grace (5 s) is longer than the close

    @c.task(name="sleeper")
    async def sleeper(token: CancellationToken) -> None:
        await asyncio.sleep(60)  # never checks its token, but can be cancelled

    refused, slept = c.tasks["refuser"].submit(), c.tasks["sleeper"].submit()
    wait_until(lambda: refused.status is S.RUNNING and slept.status is S.RUNNING)
    with caplog.at_level(logging.WARNING, logger="chongming_task.controller"):
        began = time.monotonic()
        c.close(timeout=3)
        took = time.monotonic() - began
    assert took < 4.5, f"close(timeout=3) took {took:.1f} s"
    assert slept.snapshot().status is S.STOPPED  # cancelled within the close's time
    assert slept.snapshot().failure is None
    final = refused.snapshot()
    assert final.status is S.STOPPED and final.failure is not None
    assert final.failure.carrier_may_run and "refused cancellation" in final.failure.message
    assert c.store.get(refused.task_id) == final
    closed = [r.getMessage() for r in caplog.records if "closed:" in r.getMessage()]
    assert len(closed) == 1 and "refuser" in closed[0] and "refused cancellation" in closed[0]
    refuser.released = True
    wait_until(lambda: refuser.ended, what="the coroutine let go")


def test_a_task_that_swallows_its_cancellation_still_ends_as_the_timeout_says(
    make_controller: Make, caplog: pytest.LogCaptureFixture
) -> None:
    c = make_controller()

    @c.task(name="stubborn", timeout=0.2)
    async def stubborn(token: CancellationToken) -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "ignored it"
        return "slept"

    with caplog.at_level(logging.WARNING, logger="chongming_task.aio"):
        run = c.tasks["stubborn"].submit()
        final = run.wait(timeout=10)
    assert final.status is S.FAILED and final.failure is not None
    assert final.failure.kind is FailureKind.TIMEOUT
    (line,) = [r for r in caplog.records if "swallowed its cancellation" in r.getMessage()]
    # The node's own line about the task names it, as the task's own records do.
    assert (line.task_id, line.task_name, line.attempt) == (run.task_id, "stubborn", 1)  # type: ignore[attr-defined]


def test_the_blocking_token_calls_in_an_async_task_name_their_twins(
    make_controller: Make,
) -> None:
    c = make_controller()

    @c.task(name="blocks")
    async def blocks(token: CancellationToken) -> None:
        token.checkpoint()

    @c.task(name="sleeps")
    async def sleeps(token: CancellationToken) -> None:
        token.sleep(1)

    for name, twin in (("blocks", "acheckpoint"), ("sleeps", "asleep")):
        final = c.tasks[name].submit().wait(timeout=10)
        assert final.status is S.FAILED and final.failure is not None
        assert twin in final.failure.message


def test_bad_input_gets_what_the_sync_path_gives(make_controller: Make) -> None:
    c = make_controller()
    refused: list[str] = []

    @c.task(name="nan")
    async def nan(token: CancellationToken) -> str:
        try:
            await token.acheckpoint(Progress(current=float("nan")))
        except InvalidValue as exc:
            refused.append(str(exc))
        return "went on"

    @c.task(name="unstorable")
    async def unstorable(token: CancellationToken) -> object:
        return {"bad": "\udcff"}

    async def coro() -> int:
        return 1

    @c.task(name="forgot")
    def forgot(token: CancellationToken) -> object:
        return coro()  # a sync function handing back an awaitable

    assert c.tasks["nan"].submit().result(timeout=10) == "went on" and refused
    for name, words in (("unstorable", ""), ("forgot", "async def")):
        final = c.tasks[name].submit().wait(timeout=10)
        assert final.failure is not None and final.failure.kind is FailureKind.RESULT_INVALID
        assert words in final.failure.message


def test_the_async_faces_of_node_and_run(store: TaskStore) -> None:
    async def main() -> None:
        async with Controller(store, activity_interval=0.02) as c:

            @c.task(name="hello")
            async def hello(token: CancellationToken, who: str) -> str:
                await token.asleep(0.01)
                return f"hello {who}"

            @c.task(name="long")
            async def long(token: CancellationToken) -> None:
                await token.asleep(60)

            run = await c.tasks["hello"].asubmit("async")
            assert await run.aresult(timeout=10) == "hello async"
            assert (await run.await_(timeout=10)).status is S.SUCCEEDED
            stuck = await c.tasks["long"].asubmit()
            while stuck.status is not S.RUNNING:
                await asyncio.sleep(0.01)
            assert (await c.apause(stuck.task_id)).outcome in ("pausing", "paused")
            assert (await c.aresume(stuck.task_id)).outcome == "resumed"
            await c.astop(stuck.task_id)
            with pytest.raises(TaskUnsuccessful):
                await stuck.aresult(timeout=10)

    asyncio.run(main())


def test_a_task_that_blocks_the_loop_is_named_and_counted(
    make_controller: Make, caplog: pytest.LogCaptureFixture
) -> None:
    c = make_controller()

    @c.task(name="hog")
    async def hog(token: CancellationToken) -> str:
        await token.asleep(0.05)
        time.sleep(0.4)  # sync work inside async def: every other async task waits
        return "done"

    with caplog.at_level(logging.WARNING, logger="chongming_task.aio"):
        run = c.tasks["hog"].submit()
        assert run.result(timeout=10) == "done"
        wait_until(lambda: c.health().loop_stalls >= 1, what="the stall counted")
    said = [
        r.getMessage() for r in caplog.records if "blocked the node's event loop" in r.getMessage()
    ]
    assert said and f"task {run.task_id} (hog)" in said[0], said
    seconds = float(said[0].split("for about ")[1].split(" s")[0])
    assert 0.2 < seconds < 1.0


def test_an_async_task_says_so_in_its_tags(store: TaskStore, make_controller: Make) -> None:
    c = make_controller(store)

    @c.task(name="tagged", tags=["io"])
    async def tagged(token: CancellationToken) -> None:
        return None

    run = c.tasks["tagged"].submit()
    run.wait(10)
    stored = store.get(run.task_id)
    assert stored is not None and stored.tags == frozenset({"io", "async"})


def test_a_buckets_limit_counts_async_and_thread_tasks_together(make_controller: Make) -> None:
    c = make_controller(max_parallel_per_bucket=1, max_workers=4)
    inside: list[str] = []
    overlaps: list[str] = []

    def enter(name: str) -> None:
        if inside:
            overlaps.append(f"{name} beside {inside}")
        inside.append(name)

    @c.task(name="athing")
    async def athing(token: CancellationToken) -> None:
        enter("async")
        await token.asleep(0.05)
        inside.remove("async")

    @c.task(name="sthing")
    def sthing(token: CancellationToken) -> None:
        enter("sync")
        token.sleep(0.05)
        inside.remove("sync")

    runs = []
    for _ in range(5):
        runs.append(c.tasks["athing"].configure(bucket_key="tenant-1").submit())
        runs.append(c.tasks["sthing"].configure(bucket_key="tenant-1").submit())
    for run in runs:
        assert run.wait(timeout=20).status is S.SUCCEEDED
    assert overlaps == []


def test_async_tasks_in_pipelines_and_schedules(make_controller: Make) -> None:
    from chongming_task import IntervalTrigger, Pipeline

    c = make_controller()

    @c.task(name="fetch")
    async def fetch(token: CancellationToken) -> list[int]:
        await token.asleep(0.01)
        return [3, 1, 2]

    @c.task(name="order")
    def order(token: CancellationToken) -> list[int]:
        return sorted(token.upstream["fetch"])

    @c.task(name="count")
    async def count(token: CancellationToken) -> int:
        return len(token.upstream["order"])

    flow = Pipeline("mixed")
    flow.add("fetch", "fetch")
    flow.add("order", "order", depends_on=["fetch"])
    flow.add("count", "count", depends_on=["order"])
    ended = c.submit_pipeline(flow).wait(timeout=10)
    assert ended["order"].outcome == [1, 2, 3] and ended["count"].outcome == 3
    c.schedule("tick", "fetch", IntervalTrigger(seconds=0.1))
    wait_until(
        lambda: sum(t.name == "fetch" and t.status is S.SUCCEEDED for t in c.list_tasks()) >= 3,
        what="the schedule firing an async task",
    )


def test_a_sync_submit_on_a_running_event_loop_is_warned_once_naming_asubmit(
    make_controller: Make, caplog: pytest.LogCaptureFixture
) -> None:
    c = make_controller()
    noop = c.task(lambda token: None, name="noop")

    async def main() -> None:
        noop.submit()  # blocks the loop: said
        noop.submit()  # said once
        await noop.asubmit()  # the awaited twin: not said

    noop.submit()  # no loop runs here: not said
    with caplog.at_level(logging.WARNING, logger="chongming_task.submit"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if r.name == "chongming_task.submit"]
    assert len(said) == 1
    assert "on a running event loop" in said[0] and "await asubmit(...)" in said[0]
