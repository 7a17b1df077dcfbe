"""The public surface, pinned: what ``chongming_task`` exports and each public class's
public names change only on purpose (edit the lists here in the same change), and every
call that waits or touches the store has its awaited twin (docs/design.md, "One async
rule")."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

import chongming_task
from chongming_task import (
    CancellationToken,
    ConfiguredTask,
    Controller,
    InMemoryTaskStore,
    Pipeline,
    PipelineRun,
    StoredTask,
    Task,
    TaskRun,
)

EXPORTS = {
    "BucketPolicy", "CancellationToken", "ChongmingTaskError", "Clock", "Command",
    "CommandAction", "ConcurrencyConflict", "ConfigurationError", "ConfiguredTask",
    "ControlOutcome", "ControlReceipt", "Controller", "ControllerClosed", "CronTrigger",
    "CurrentTask", "Failure", "FailureKind", "IllegalTransition", "InMemoryTaskStore",
    "IntervalTrigger", "InvalidValue", "Pipeline", "PipelineNode", "PipelineRun",
    "PostgresTaskStore", "Progress", "ReconcileReport", "Retry", "RetryPolicy", "Schedule",
    "SqliteTaskStore", "StopRequested", "StoreError", "StoreUnavailable", "StoredTask",
    "SystemClock", "Task", "TaskAlreadyExists", "TaskDefinition", "TaskDesynced",
    "TaskNotFound", "TaskQuery", "TaskRun", "TaskSnapshot", "TaskStatus", "TaskStore",
    "TaskUnsuccessful", "Transition", "UnknownTask", "WaitTimeout", "current", "define",
    "task",
}  # fmt: skip

NAMES: dict[type, set[str]] = {
    Controller: {
        # settings and what the node is made of
        "activity_interval", "bucket_policy", "capabilities", "clock", "command_lease",
        "command_poll_interval", "lease_ttl", "max_workers", "num_buckets", "owned_buckets",
        "owner", "owns_all_buckets", "owns_bucket", "rng", "store", "value_rules",
        "writethrough_buffer",
        # tasks and submitting
        "task", "tasks", "register", "submit", "asubmit", "submit_many", "asubmit_many",
        "submit_pipeline", "asubmit_pipeline",
        # schedules
        "schedule", "aschedule", "unschedule", "aunschedule", "schedules", "tick_schedules",
        "atick_schedules",
        # control
        "stop", "astop", "pause", "apause", "resume", "aresume", "cancel", "acancel",
        "poll_commands_once", "apoll_commands_once",
        # reads and waits
        "get", "aget", "history", "ahistory", "list_tasks", "alist_tasks", "stats", "astats",
        "bucket_counts", "abucket_counts", "wait_for", "await_for", "wait_idle", "await_idle",
        "health", "held", "desynced_tasks",
        # life
        "reconcile", "areconcile", "serve", "close", "aclose",
    },
    Task: {"name", "definition", "submit", "asubmit", "submit_many", "asubmit_many", "configure"},
    ConfiguredTask: {
        "task", "options", "submit", "asubmit", "submit_many", "asubmit_many", "configure",
    },
    TaskRun: {
        "task_id", "name", "status", "bucket", "priority", "concurrency_key", "progress",
        "snapshot", "history", "done", "desynced", "written", "write_error",
        "wait", "await_", "result", "aresult",
        "stop", "astop", "pause", "apause", "resume", "aresume", "cancel", "acancel",
    },
    StoredTask: {
        "task_id", "snapshot", "asnapshot", "history", "ahistory", "done", "adone",
        "wait", "await_", "result", "aresult",
        "stop", "astop", "pause", "apause", "resume", "aresume", "cancel", "acancel",
    },
    CancellationToken: {
        "checkpoint", "acheckpoint", "sleep", "asleep", "upstream", "stop_requested", "progress",
    },
    PipelineRun: {
        "pipeline", "pipeline_run_id", "nodes", "snapshots", "status", "done", "wait", "await_",
        "result", "aresult", "node_finished",
    },
    Pipeline: {"name", "fail_fast", "nodes", "add", "dependents"},
}  # fmt: skip

TWINS: dict[type, list[str]] = {
    Controller: [
        "submit", "submit_many", "submit_pipeline", "schedule", "unschedule", "tick_schedules",
        "stop", "pause", "resume", "cancel", "poll_commands_once", "get", "history",
        "list_tasks", "stats", "bucket_counts", "wait_for", "wait_idle", "reconcile", "close",
    ],
    Task: ["submit", "submit_many"],
    ConfiguredTask: ["submit", "submit_many"],
    TaskRun: ["wait", "result", "stop", "pause", "resume", "cancel"],
    StoredTask: [
        "snapshot", "history", "done", "wait", "result", "stop", "pause", "resume", "cancel",
    ],
    CancellationToken: ["checkpoint", "sleep"],
    PipelineRun: ["wait", "result"],
}  # fmt: skip


def _public(names: object) -> set[str]:
    return {n for n in dir(names) if not n.startswith("_")}


def test_the_package_exports_what_is_pinned() -> None:
    assert set(chongming_task.__all__) == EXPORTS
    for name in EXPORTS:
        assert getattr(chongming_task, name) is not None


def _instances() -> dict[type, object]:
    node = Controller(InMemoryTaskStore(), owner="surface", run_schedules=False)

    @node.task(name="one")
    def one(token: CancellationToken) -> None:
        return None

    pipe = Pipeline("p")
    pipe.add("a", one)
    seen: dict[type, object] = {Controller: node, Task: one, ConfiguredTask: one.configure()}
    run = one.submit()
    seen[TaskRun] = run
    seen[StoredTask] = StoredTask(run.task_id, node.store, lambda *a: None)  # type: ignore[arg-type, return-value]
    seen[PipelineRun] = node.submit_pipeline(pipe)
    seen[Pipeline] = pipe
    node.wait_idle(10)
    node.close()
    return seen


def test_each_public_class_shows_the_names_pinned() -> None:
    instances = _instances()
    for cls, names in NAMES.items():
        shown = _public(instances.get(cls, cls))
        assert shown == names, (
            f"{cls.__name__}: new {sorted(shown - names)}, gone {sorted(names - shown)}"
        )


def _twin(name: str) -> str:
    return {"wait": "await_", "wait_for": "await_for", "wait_idle": "await_idle"}.get(
        name, "a" + name
    )


@pytest.mark.parametrize("cls", list(TWINS), ids=lambda c: c.__name__)
def test_every_call_that_waits_or_touches_the_store_has_its_awaited_twin(cls: type) -> None:
    for name in TWINS[cls]:
        blocking: Callable[..., object] = getattr(cls, name)
        twin: Callable[..., object] = getattr(cls, _twin(name))
        assert not inspect.iscoroutinefunction(blocking), name
        assert inspect.iscoroutinefunction(twin), f"{cls.__name__}.{_twin(name)}"
        given = [(p.name, p.kind) for p in inspect.signature(blocking).parameters.values()]
        taken = [(p.name, p.kind) for p in inspect.signature(twin).parameters.values()]
        assert given == taken, f"{cls.__name__}.{_twin(name)} takes other arguments"
        want = inspect.signature(blocking).return_annotation
        got = inspect.signature(twin).return_annotation
        assert want == got, f"{cls.__name__}.{_twin(name)} answers {got}, not {want}"
    # Calls that read only this process's memory have no twin to keep up.
    assert not hasattr(TaskRun, "asnapshot") and not hasattr(TaskRun, "wait_async")


@pytest.mark.parametrize("cls", ["Controller", "SqliteTaskStore", "PostgresTaskStore"])
def test_help_names_every_constructor_argument(cls: str) -> None:
    made = getattr(chongming_task, cls)
    documented = (inspect.getdoc(made.__init__) or "") + (inspect.getdoc(made) or "")
    for name in inspect.signature(made.__init__).parameters:
        if name != "self":
            named = f"``{name}``" in documented or f"``{name}=" in documented
            assert named, f"{cls}({name}=...) is not in help()"
