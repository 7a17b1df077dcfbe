"""Pipelines: a DAG of task nodes submitted together under one ``pipeline_run_id``.

The structure lives in this process only (the store keeps each node's task and the run
id, never the graph): a pipeline is coordinated by the node that submitted it, never
across nodes (docs/design.md, "Autonomous nodes, one plane").

Semantics:

* a node is queued once every dependency succeeded; it reads their results from
  ``token.upstream`` (dependency key -> result);
* a dependency that ends ``failed``, ``lost``, ``stopped`` or ``cancelled`` cancels its
  dependents, transitively (failure kind ``dependency``);
* ``fail_fast=True``: the first ``failed`` or ``lost`` node stops the running nodes and
  cancels the waiting ones of the same run; ``cancelled`` (a user's cancel, or one that
  fail-fast made) never triggers fail-fast: no chain reaction, and a user's cancel is
  recorded as ``cancelled``, never as ``failed``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import states
from .definitions import TaskRef
from .errors import ConfigurationError, TaskUnsuccessful, WaitTimeout
from .model import Failure, FailureKind, JSONValue, TaskSnapshot, TaskStatus

if TYPE_CHECKING:
    from .run.handle import TaskRun
    from .run.life import Run

__all__ = [
    "Pipeline",
    "PipelineNode",
    "PipelineRun",
]

S = TaskStatus


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineNode:
    """One node: a task definition (or its name), arguments, and the keys it waits for."""

    key: str
    task: TaskRef
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()
    bucket_key: str | None = None


class Pipeline:
    """A DAG declaration. Unknown dependencies and cycles are rejected as declared."""

    def __init__(
        self, name: str, nodes: Iterable[PipelineNode] = (), *, fail_fast: bool = False
    ) -> None:
        if not name:
            raise ConfigurationError("a pipeline needs a name")
        self.name = name
        self.fail_fast = fail_fast
        self.nodes: dict[str, PipelineNode] = {}
        pending = list(nodes)
        for node in pending:
            if node.key in self.nodes:
                raise ConfigurationError(f"pipeline {name}: node {node.key!r} declared twice")
            self.nodes[node.key] = node
        self._check()

    def add(
        self,
        key: str,
        task: TaskRef,
        /,
        *,
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        depends_on: Iterable[str] = (),
        bucket_key: str | None = None,
    ) -> str:
        """Declare a node: ``task`` called with ``args`` and ``kwargs`` (checked when the
        pipeline is submitted), after every node in ``depends_on`` (declared already)
        succeeded, in the bucket ``bucket_key`` picks. Returns ``key``."""
        if isinstance(depends_on, str):
            raise ConfigurationError(
                f"pipeline {self.name}: depends_on must be a list of keys, not the text "
                f"{depends_on!r}"
            )
        if key in self.nodes:
            raise ConfigurationError(f"pipeline {self.name}: node {key!r} declared twice")
        node = PipelineNode(
            key=key,
            task=task,
            args=tuple(args),
            kwargs=dict(kwargs or {}),
            depends_on=tuple(depends_on),
            bucket_key=bucket_key,
        )
        self.nodes[key] = node
        try:
            self._check()
        except ConfigurationError:
            del self.nodes[key]
            raise
        return key

    def _check(self) -> None:
        for node in self.nodes.values():
            unknown = [d for d in node.depends_on if d not in self.nodes]
            if unknown:
                raise ConfigurationError(
                    f"pipeline {self.name}: node {node.key!r} depends on unknown "
                    f"node(s) {', '.join(map(repr, unknown))}"
                )
        # Kahn's algorithm: whatever cannot be ordered sits on (or behind) a cycle.
        indegree = {k: len(set(n.depends_on)) for k, n in self.nodes.items()}
        ready = [k for k, d in indegree.items() if d == 0]
        ordered: list[str] = []
        dependents = self.dependents()
        while ready:
            key = ready.pop()
            ordered.append(key)
            for child in dependents[key]:
                indegree[child] -= 1
                if indegree[child] == 0:
                    ready.append(child)
        if len(ordered) != len(self.nodes):
            stuck = sorted(k for k in self.nodes if k not in ordered)
            raise ConfigurationError(
                f"pipeline {self.name}: dependency cycle among {', '.join(map(repr, stuck))}"
            )

    def dependents(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {k: [] for k in self.nodes}
        for node in self.nodes.values():
            for dep in dict.fromkeys(node.depends_on):
                out[dep].append(node.key)
        return out


class PipelineRun:
    """One submitted pipeline: its node runs, waiting, per-node snapshots, overall outcome."""

    def __init__(
        self,
        pipeline: Pipeline,
        pipeline_run_id: str,
        runs: dict[str, Run],
        enqueue: Callable[[Run, str], bool],
        handle: Callable[[Run], TaskRun],
    ) -> None:
        self.pipeline = pipeline
        self.pipeline_run_id = pipeline_run_id
        self._runs = runs
        self.nodes: dict[str, TaskRun] = {key: handle(run) for key, run in runs.items()}
        """Each node's handle, by its key."""
        self._enqueue = enqueue  # Controller._enqueue_pending
        self._dependents = pipeline.dependents()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._fast_failed = False

    def __repr__(self) -> str:
        return f"<PipelineRun {self.pipeline.name} {self.pipeline_run_id}>"

    # -- the handle ------------------------------------------------------------------------------

    def snapshots(self) -> dict[str, TaskSnapshot]:
        return {key: run.snapshot() for key, run in self._runs.items()}

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> dict[str, TaskSnapshot]:
        """Block until every node is terminal; return their final snapshots."""
        if not self._done.wait(timeout):
            waiting = sorted(k for k, r in self._runs.items() if not r.done())
            raise WaitTimeout(
                f"pipeline {self.pipeline.name} ({self.pipeline_run_id}): "
                f"{', '.join(waiting)} not finished after {timeout}s"
            )
        return self.snapshots()

    async def await_(self, timeout: float | None = None) -> dict[str, TaskSnapshot]:
        """``wait()``, awaited."""
        return await asyncio.to_thread(self.wait, timeout)

    @property
    def status(self) -> TaskStatus | None:
        """How the run ended: ``None`` while running; then ``succeeded`` if every node
        did, else the worst end among the nodes: ``failed`` > ``lost`` > ``stopped`` >
        ``cancelled``."""
        if not self._done.is_set():
            return None
        ends = {run.status for run in self._runs.values()}
        for status in states.WORST_FIRST:
            if status in ends:
                return status
        return S.SUCCEEDED

    def result(self, key: str, timeout: float | None = None) -> JSONValue:
        """Node ``key``'s return value; ``TaskUnsuccessful`` if it did not succeed."""
        final = self._runs[key].wait(timeout)
        if final.status is not S.SUCCEEDED:
            raise TaskUnsuccessful(final)
        return final.outcome

    async def aresult(self, key: str, timeout: float | None = None) -> JSONValue:
        """``result()``, awaited."""
        return await asyncio.to_thread(self.result, key, timeout)

    # -- reactions (on the controller's pipeline thread, holding no run lock) ---------------------

    def node_finished(self, run: Run) -> None:
        """A node ended (the node's pipeline thread calls this)."""
        key = run.node_key
        assert key is not None
        status = run.status
        if status is S.SUCCEEDED:
            for child in self._dependents[key]:
                deps = self.pipeline.nodes[child].depends_on
                if all(self._runs[d].status is S.SUCCEEDED for d in deps):
                    child_run = self._runs[child]
                    child_run.signals.upstream = {d: self._runs[d].snapshot().outcome for d in deps}
                    self._enqueue(child_run, f"dependencies {', '.join(deps)} succeeded")
        else:
            self._cancel_dependents(key, status)
            if status in states.TRIGGERS_FAIL_FAST and self.pipeline.fail_fast:
                self._fail_fast(key, status)
        self._check_done()

    def _cancel_dependents(self, key: str, status: TaskStatus) -> None:
        seen: set[str] = set()
        stack = list(self._dependents[key])
        while stack:
            child = stack.pop()
            if child in seen:
                continue
            seen.add(child)
            self._runs[child].cancel_waiting(
                Failure(
                    kind=FailureKind.DEPENDENCY,
                    message=f"dependency {key!r} ended {status.value}",
                ),
            )
            stack.extend(self._dependents[child])

    def _fail_fast(self, key: str, status: TaskStatus) -> None:
        with self._lock:
            if self._fast_failed:
                return
            self._fast_failed = True
        reason = f"fail-fast: node {key!r} {status.value}"
        for other, run in self._runs.items():
            if other == key or run.done():
                continue
            failure = Failure(kind=FailureKind.DEPENDENCY, message=reason)
            if not run.cancel_waiting(failure):
                run.stop(reason=reason)

    def _check_done(self) -> None:
        if all(run.done() for run in self._runs.values()):
            self._done.set()
