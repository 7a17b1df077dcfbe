"""Pipelines: DAG semantics, results flowing downstream, fail-fast without chain reactions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    ConfigurationError,
    Controller,
    FailureKind,
    Pipeline,
    PipelineNode,
    TaskQuery,
    TaskStatus,
    TaskStore,
)
from tests.conftest import run_of, wait_until

S = TaskStatus
Make = Callable[..., Controller]


def define(c: Controller) -> dict[str, Any]:
    gate = threading.Event()

    @c.task(name="value")
    def value(token: CancellationToken, x: int) -> int:
        return x

    @c.task(name="add")
    def add(token: CancellationToken) -> int:
        return sum(token.upstream.values())

    @c.task(name="boom")
    def boom(token: CancellationToken) -> None:
        raise RuntimeError("boom")

    @c.task(name="loop")
    def loop(token: CancellationToken) -> str:
        while not gate.is_set():
            token.checkpoint()
            token.sleep(0.005)
        return "released"

    return {"gate": gate}


def test_a_diamond_succeeds_and_results_flow_to_dependents(
    store: TaskStore, make_controller: Make
) -> None:
    c = make_controller(store)
    define(c)
    pipe = Pipeline("diamond")
    pipe.add("a", "value", args=(1,))
    pipe.add("b", "add", depends_on=["a"])
    pipe.add("c", "add", depends_on=["a"])
    pipe.add("d", "add", depends_on=["b", "c"])
    run = c.submit_pipeline(pipe)
    final = run.wait(10)
    assert {k: s.status for k, s in final.items()} == dict.fromkeys("abcd", S.SUCCEEDED)
    assert run.result("d") == 2 and run.status is S.SUCCEEDED
    assert not hasattr(run, "outcome")  # a status, never under a result's name
    assert run_of(run.nodes["d"]).signals.upstream == {"b": 1, "c": 1}
    stored = c.list_tasks(TaskQuery(pipeline_run_id=run.pipeline_run_id))
    assert sorted(s.task_id for s in stored) == sorted(r.task_id for r in run.nodes.values())
    history = [t.to_status for t in c.history(run.nodes["d"].task_id)]
    assert history[:2] == [S.PENDING, S.QUEUED]  # waited for its dependencies
    starts = {k: r.snapshot().started_at for k, r in run.nodes.items()}
    assert starts["a"] <= starts["b"] and starts["a"] <= starts["c"]  # type: ignore[operator]
    assert max(starts["b"], starts["c"]) <= starts["d"]  # type: ignore[type-var,operator]


def test_a_failed_middle_node_cancels_only_its_dependents(make_controller: Make) -> None:
    c = make_controller()
    define(c)
    pipe = Pipeline("partial")
    pipe.add("a", "value", args=(1,))
    pipe.add("b", "boom", depends_on=["a"])
    pipe.add("c", "add", depends_on=["b"])
    pipe.add("d", "add", depends_on=["c"])
    pipe.add("x", "add", depends_on=["a"])
    run = c.submit_pipeline(pipe)
    final = run.wait(10)
    assert final["b"].status is S.FAILED
    for key in ("c", "d"):
        assert final[key].status is S.CANCELLED
        assert final[key].failure is not None
        assert final[key].failure.kind is FailureKind.DEPENDENCY
    assert final["c"].failure.message == "dependency 'b' ended failed"  # type: ignore[union-attr]
    assert final["x"].status is S.SUCCEEDED  # the independent branch ran to the end
    assert run.status is S.FAILED


def test_fail_fast_stops_the_running_sibling_and_cancels_the_rest(make_controller: Make) -> None:
    c = make_controller()
    define(c)
    pipe = Pipeline("fast", fail_fast=True)
    pipe.add("slow", "loop")
    pipe.add("after_slow", "add", depends_on=["slow"])
    pipe.add("bad", "boom")
    pipe.add("after_bad", "add", depends_on=["bad"])
    run = c.submit_pipeline(pipe)
    final = run.wait(10)
    assert final["bad"].status is S.FAILED
    assert final["slow"].status is S.STOPPED  # stopped while running, not failed
    assert final["after_slow"].status is S.CANCELLED
    assert final["after_bad"].status is S.CANCELLED
    assert final["after_slow"].failure is not None
    assert final["after_slow"].failure.message == "fail-fast: node 'bad' failed"
    assert run.status is S.FAILED
    stopping = [t for t in c.history(run.nodes["slow"].task_id) if t.to_status is S.STOPPING]
    assert stopping and stopping[0].reason == "fail-fast: node 'bad' failed"


def test_a_user_cancel_never_triggers_fail_fast(make_controller: Make) -> None:
    c = make_controller()
    gate = define(c)["gate"]
    pipe = Pipeline("cancel", fail_fast=True)
    pipe.add("a", "loop")
    pipe.add("b", "loop")
    pipe.add("c", "add", depends_on=["a"])
    run = c.submit_pipeline(pipe)
    wait_until(lambda: run.nodes["a"].status is S.RUNNING and run.nodes["b"].status is S.RUNNING)
    c.cancel(run.nodes["a"].task_id)
    wait_until(lambda: run.nodes["c"].done(), what="dependent cancelled")
    assert run.nodes["a"].status is S.CANCELLED and run.nodes["a"].snapshot().failure is None
    assert run.nodes["c"].status is S.CANCELLED
    # The sibling keeps running: a cancel is not a failure and does not chain.
    threading.Event().wait(0.1)
    assert run.nodes["b"].status is S.RUNNING
    gate.set()
    final = run.wait(10)
    assert final["b"].status is S.SUCCEEDED
    assert run.status is S.CANCELLED


def test_declaration_rejects_unknown_dependencies_and_cycles() -> None:
    pipe = Pipeline("p")
    pipe.add("a", "value", args=(1,))
    with pytest.raises(ConfigurationError, match="unknown node"):
        pipe.add("b", "add", depends_on=["nope"])
    assert list(pipe.nodes) == ["a"]
    with pytest.raises(ConfigurationError, match="declared twice"):
        pipe.add("a", "value", args=(2,))
    with pytest.raises(ConfigurationError, match="dependency cycle among 'x', 'y', 'z'"):
        Pipeline(
            "cyclic",
            [
                PipelineNode(key="w", task="value", args=(1,)),
                PipelineNode(key="x", task="add", depends_on=("w", "z")),
                PipelineNode(key="y", task="add", depends_on=("x",)),
                PipelineNode(key="z", task="add", depends_on=("y",)),
            ],
        )
    with pytest.raises(ConfigurationError, match="unknown node"):
        Pipeline("dangling", [PipelineNode(key="a", task="add", depends_on=("ghost",))])


def test_pipeline_nodes_obey_bucket_ownership(make_controller: Make) -> None:
    c = make_controller(owned_buckets=range(0, 8))
    define(c)
    pipe = Pipeline("owned")
    pipe.add("a", "value", args=(1,))  # no bucket key on a partitioned node
    with pytest.raises(ConfigurationError, match="needs a bucket_key"):
        c.submit_pipeline(pipe)
    assert c.held() == [] and c.list_tasks() == []
