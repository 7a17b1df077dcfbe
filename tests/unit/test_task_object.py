"""The task object: what ``@node.task`` and ``@chongming_task.task`` return, and the one
rule of submitting (every argument of ``submit`` is the function's, options live in
``configure``)."""

from __future__ import annotations

import asyncio

import pytest

import chongming_task
from chongming_task import (
    CancellationToken,
    ConfigurationError,
    ConfiguredTask,
    Controller,
    InMemoryTaskStore,
    IntervalTrigger,
    InvalidValue,
    Pipeline,
    Task,
    TaskAlreadyExists,
    TaskStatus,
    UnknownTask,
)


def test_a_parameter_named_like_an_option_is_the_functions_own() -> None:
    with Controller(InMemoryTaskStore(), owner="face") as node:

        @node.task(name="tier")
        def tier(token: CancellationToken, account: str, priority: int, bucket_key: str) -> str:
            return f"{account}:{priority}:{bucket_key}"

        assert isinstance(tier, Task) and tier.name == "tier"
        run = tier.submit("acme", priority=7, bucket_key="gold")
        assert run.result(timeout=10) == "acme:7:gold"
        stored = node.get(run.task_id)
        assert stored.priority == 0 and stored.bucket_key is None  # no option was taken
        configured = tier.configure(priority=3, bucket_key="t-1")
        assert isinstance(configured, ConfiguredTask)
        other = configured.submit("acme", priority=1, bucket_key="x")
        assert other.result(timeout=10) == "acme:1:x"
        stored = node.get(other.task_id)
        assert stored.priority == 3 and stored.bucket_key == "t-1"


def test_an_option_given_to_submit_is_a_type_error_naming_configure() -> None:
    def export(token: CancellationToken, customer: str) -> str:
        return customer

    with Controller(InMemoryTaskStore(), owner="face") as node:
        with pytest.raises(TypeError, match=r"task\.configure\(bucket_key=\.\.\.\)"):
            node.submit(export, "c1", bucket_key="c1")
        task = node.task(export)
        with pytest.raises(TypeError, match=r"task\.configure\(delay=\.\.\., priority=\.\.\.\)"):
            task.submit("c1", priority=2, delay=5)
        assert node.store.query() == []
        assert node.submit(export, "c1").result(timeout=10) == "c1"


def test_configure_checks_its_options_and_chains() -> None:
    with Controller(InMemoryTaskStore(), owner="face") as node:

        @node.task(name="echo")
        def echo(token: CancellationToken, x: str) -> str:
            return x

        with pytest.raises(InvalidValue, match="priority"):
            echo.configure(priority=2**40)
        with pytest.raises(InvalidValue, match="tags"):
            echo.configure(tags="one")
        with pytest.raises(TypeError, match="priorty"):
            echo.configure(priority=1).configure(priorty=2)
        keyed = echo.configure(dedupe_key="once", delay=30).configure(on_duplicate="raise")
        assert keyed.options.delay == 30 and keyed.options.on_duplicate == "raise"
        first = keyed.submit("a")
        with pytest.raises(TaskAlreadyExists):
            keyed.submit("b")
        assert node.get(first.task_id).status is TaskStatus.QUEUED
        node.cancel(first.task_id)


def test_submit_many_and_the_awaited_twins() -> None:
    with Controller(InMemoryTaskStore(), owner="face") as node:

        @node.task(name="double")
        def double(token: CancellationToken, x: int) -> int:
            return 2 * x

        assert [r.result(timeout=10) for r in double.submit_many([(1,), (2,)])] == [2, 4]
        later = double.configure(priority=4).submit_many([(3,)])
        assert [r.result(timeout=10) for r in later] == [6]

        async def from_a_loop() -> list[object]:
            one = await double.asubmit(5)
            many = await double.asubmit_many([(6,), (7,)])
            keyed = await double.configure(tags={"loop"}).asubmit(8)
            configured_many = await double.configure(priority=1).asubmit_many(iter([(9,)]))
            runs = [one, *many, keyed, *configured_many]
            return [await run.aresult(10) for run in runs]

        assert asyncio.run(from_a_loop()) == [10, 12, 14, 16, 18]
        assert double(None, 21) == 42  # calling the task calls the function


def test_a_module_level_task_submits_once_a_node_registers_it() -> None:
    @chongming_task.task(name="shared", retries=2)
    def shared(token: CancellationToken, x: int) -> int:
        return x + 1

    assert shared.definition.retry.retries == 2
    with pytest.raises(ConfigurationError, match="registered on no node"):
        shared.submit(1)
    first = Controller(InMemoryTaskStore(), owner="first")
    second = Controller(InMemoryTaskStore(), owner="second")
    try:
        assert first.register(shared) is shared  # bound to the first node it met
        for_second = second.register(shared)
        assert for_second is not shared and for_second.definition is shared.definition
        run = shared.submit(1)
        assert run.result(timeout=10) == 2 and first.store.get(run.task_id) is not None
        there = for_second.submit(2)
        assert there.result(timeout=10) == 3 and second.store.get(there.task_id) is not None
        assert "shared" in second.tasks and second.tasks["shared"].submit(3).result(10) == 4
    finally:
        first.close()
    with Controller(InMemoryTaskStore(), owner="third") as third:
        assert third.register(shared) is shared  # its node closed: this one takes it
        assert third.store.get(shared.submit(4).task_id) is not None
    second.close()


def test_the_tasks_of_a_node_by_name() -> None:
    with Controller(InMemoryTaskStore(), owner="face") as node:

        def plain(token: CancellationToken) -> str:
            return "plain"

        node.task(plain, name="plain")
        assert node.task(plain, name="plain").definition is node.tasks["plain"].definition
        with pytest.raises(ConfigurationError, match="already defined"):
            node.task(plain, name="plain", retries=4)
        with pytest.raises(UnknownTask, match="no task named 'nope'") as raised:
            node.tasks["nope"]
        assert isinstance(raised.value, KeyError) and str(raised.value).startswith("no task")
        assert list(node.tasks) == ["plain"] and len(node.tasks) == 1
        with pytest.raises(TypeError, match=r"node\.tasks\['plain'\]\.submit"):
            node.submit("plain")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="not a name"):
            node.submit_many("plain", [()])  # type: ignore[arg-type]
        assert node.tasks["plain"].submit().result(timeout=10) == "plain"
        with pytest.raises(ConfigurationError, match="is a task already"):
            node.task(node.tasks["plain"])  # type: ignore[arg-type]


def test_schedules_and_pipelines_take_the_arguments_apart_from_their_settings() -> None:
    with Controller(InMemoryTaskStore(), owner="face", run_schedules=False) as node:

        @node.task(name="rank")
        def rank(token: CancellationToken, who: str, *, priority: int = 0) -> str:
            return f"{who}@{priority}"

        entry = node.schedule(
            "ranked", rank, IntervalTrigger(60), args=["ops"], kwargs={"priority": 9}, priority=5
        )
        assert entry.args == ("ops",) and dict(entry.kwargs) == {"priority": 9}
        with pytest.raises(TypeError):
            node.schedule("wrong", rank, IntervalTrigger(60), "ops")  # type: ignore[misc]
        with pytest.raises(TypeError, match=r"task rank: .*nothing was submitted"):
            node.schedule("missing", rank, IntervalTrigger(60), kwargs={"priority": 1})

        pipe = Pipeline("p")
        pipe.add("a", rank, args=("x",), kwargs={"priority": 2})
        pipe.add("b", "rank", args=["y"], depends_on=["a"])
        with pytest.raises(ConfigurationError, match="depends_on must be a list"):
            pipe.add("c", rank, args=("z",), depends_on="a")
        finals = node.submit_pipeline(pipe).wait(timeout=10)
        assert finals["a"].outcome == "x@2" and finals["b"].outcome == "y@0"
