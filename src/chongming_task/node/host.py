"""``NodeHost``: what a run needs from its node (the ``RunHost`` protocol), as an object of
its own, so that the runs talk to the node's services and never to the Controller."""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

from .. import observe
from ..clock import Clock
from ..errors import ConcurrencyConflict
from ..health import FaultLog
from ..model import TaskSnapshot, TaskStatus
from ..stores.capabilities import Capabilities
from ..values import ValueRules

if TYPE_CHECKING:
    from ..run.life import Run
    from ..run.writers import BehindWriter
    from .aio import AsyncRunner
    from .dispatch import Dispatcher
    from .pipeline_runner import PipelineRunner
    from .processes import ProcessPool
    from .registry import RunRegistry
    from .workers import WorkerPool

__all__ = ["NodeHost"]

log = logging.getLogger("chongming_task.controller")


class NodeHost:
    """A node's side of its runs: settings they read, and where they report."""

    __slots__ = (
        "_aio",
        "_dispatcher",
        "_pipelines",
        "_processes",
        "_registry",
        "_workers",
        "capabilities",
        "clock",
        "faults",
        "owner",
        "rng",
        "value_rules",
        "writer",
        "writethrough_buffer",
    )

    def __init__(
        self,
        *,
        owner: str,
        clock: Clock,
        rng: random.Random,
        capabilities: Capabilities,
        writethrough_buffer: int,
        registry: RunRegistry,
        dispatcher: Dispatcher,
        workers: WorkerPool,
        pipelines: PipelineRunner,
        writer: BehindWriter | None,
        faults: FaultLog,
        aio: AsyncRunner,
        processes: ProcessPool,
    ) -> None:
        self.owner = owner
        self.faults = faults
        self._aio = aio
        self._processes = processes
        self.clock = clock
        self.rng = rng
        self.capabilities = capabilities
        self.value_rules: ValueRules = capabilities.value_rules
        self.writethrough_buffer = writethrough_buffer
        self._registry = registry
        self._dispatcher = dispatcher
        self._workers = workers
        self._pipelines = pipelines
        self.writer = writer

    def ended(self, run: Run) -> None:
        """``run`` is terminal (its end written, or buffered after a failed write)."""
        watch = observe.watcher
        if watch is not None:
            watch.run_ended(run)
        if run.pipeline is not None:
            self._pipelines.node_ended(run)
        self._registry.ended(run, written=run.written)

    def requeue(self, run: Run, delay: float) -> None:
        self._dispatcher.schedule(run, delay)

    def abandon(self, run: Run) -> None:
        if run.definition.is_async:
            return  # it holds no thread: its slot is freed when its coroutine ends
        self._workers.abandon(run)

    def cancel_async(self, run: Run, *, after: float) -> None:
        self._aio.cancel(run, after=after)

    def terminate(self, run: Run) -> bool:
        return self._processes.terminate(run)

    def suspend(self, run: Run) -> int | None:
        return self._processes.suspend(run)

    def carry_on(self, run: Run) -> None:
        self._processes.carry_on(run)

    def desynced(
        self,
        task_id: str,
        exc: ConcurrencyConflict,
        local: TaskSnapshot,
        stored: TaskSnapshot | None,
    ) -> None:
        holds = "another version" if stored is None else stored.status.value
        log.error(
            "task %s: another writer changed it in the store (%s): the store holds %s, "
            "here it is %s; write-through stopped for this task%s",
            task_id,
            exc,
            holds,
            describe_end(local),
            ", and its end here is kept as a late report" if local.is_terminal else "",
        )
        self._registry.mark_desynced(task_id)

    def report_late(self, ended: TaskSnapshot) -> None:
        self._registry.report_late(ended)

    def behind(self, task_id: str) -> None:
        self._registry.mark_behind(task_id)

    def write_failed(self, task_id: str, exc: BaseException) -> None:
        self.faults.failed(f"write of task {task_id}", exc)


def describe_end(snapshot: TaskSnapshot) -> str:
    """A run's status here, with its result or error when it has ended."""
    if snapshot.outcome is not None and snapshot.status is TaskStatus.SUCCEEDED:
        return f"{snapshot.status.value} (result {snapshot.outcome!r:.200})"
    if snapshot.failure is not None:
        return f"{snapshot.status.value} ({snapshot.failure.message:.200})"
    return snapshot.status.value
