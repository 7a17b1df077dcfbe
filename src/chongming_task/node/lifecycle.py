"""``NodeServices``: a node's background services, made together, each started at most
once and never once the node closes, and all stopped and joined in one place, in one
order. The node moves through ``NodeState`` once.

When each starts:

- the command poller and the beacon (the node's declaration in the store): from
  construction; never with ``poll_commands=False`` (a tool acting for a node without
  being one);
- reconciling and retention: from construction for a node that declares
  ``owned_buckets``, else after the first stored task;
- the writer, the workers and the supervisor: after the first stored task;
- the scheduler: on the first schedule (unless schedules are ticked by hand);
- the pipeline runner: on the first pipeline.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .. import states
from ..run.writers import BehindWriter
from .aio import AsyncRunner
from .beacon import NodeBeacon
from .commands import CommandPoller
from .dispatch import Dispatcher, FifoDispatcher
from .pipeline_runner import PipelineRunner
from .processes import ProcessPool
from .retention import RetentionLoop
from .scheduler import ScheduleRunner
from .services import LoopService, NodeContext, NodeState, Service
from .supervision import ReconcileLoop, Reconciler, Supervisor
from .workers import WorkerPool, crashed

if TYPE_CHECKING:
    from ..model import TaskStatus
    from ..run.handle import TaskRun
    from ..run.life import Run
    from ..run.stored import StoredTask
    from ..schedules import Schedule

__all__ = ["NodeServices"]

_OPEN = NodeState.OPEN

JOIN_FLOOR = 0.05
"""Seconds each service is joined for at least at a close whose time is up."""


class NodeServices:
    """The services of one node (they never hold the node itself)."""

    def __init__(
        self,
        node: NodeContext,
        *,
        dispatcher: Dispatcher,
        workers: int,
        lease_ttl: float,
        activity_interval: float,
        command_lease: float,
        command_poll_interval: float | None,
        buckets: frozenset[int] | None,
        num_buckets: int,
        rng: random.Random,
        fire: Callable[[Schedule, datetime], TaskRun | StoredTask | None],
        owns: Callable[[str | None], bool],
        follow: Callable[[str], StoredTask],
        polling: bool,
        started: Callable[[], None],
        reconciler: Reconciler,
        reconcile_interval: float | None,
        max_async: int,
        processes: ProcessPool,
        retention: Mapping[TaskStatus, timedelta] | None = None,
    ) -> None:
        """``fire`` submits a schedule's slot (``owns``: whether a bucket key is the
        node's; ``follow``: a handle on a stored task); ``polling`` is false for a node that must
        never poll commands; ``started`` is called whenever a service starts (the node
        is then closed at interpreter exit if its program does not close it);
        ``reconcile_interval`` is how often the node reconciles its buckets on its own
        (``None``: never); ``retention``, how long its finished tasks are kept, by status
        (``None``: for ever); ``processes``, the worker processes of its process tasks."""
        capabilities = node.capabilities
        self.state = NodeState.OPEN
        self._dispatcher = dispatcher
        self._lock = threading.Lock()
        self._working = False
        self._registry = node.registry
        self.polling = polling
        """Whether the node polls commands (never for a tool acting for a node)."""
        self._started = started
        # On a store that commits side-by-side writes together (SQLite, PostgreSQL), the
        # workers queue their runs' writes and go on; elsewhere each writes its own.
        write_behind = capabilities.write_behind
        self.writer: BehindWriter | None = (
            BehindWriter(write_behind, backlog=self._backlog) if write_behind is not None else None
        )
        self.workers = WorkerPool(
            registry=node.registry,
            dispatcher=dispatcher,
            size=workers,
            woken=self.writer.complete if self.writer is not None else None,
        )
        registry = node.registry

        def released(run: Run) -> None:
            registry.finished(run)
            dispatcher.done(run)

        self.aio = AsyncRunner(
            owner=node.owner, max_async=max_async, released=released, crashed=crashed
        )
        self.workers.hand_async = self.aio.hand
        self.processes = processes
        processes.released = released
        self.workers.hand_process = processes.hand
        if isinstance(dispatcher, FifoDispatcher):

            def direct(run: Run) -> None:
                registry.started(run)
                if run.definition.is_async:
                    self.aio.hand(run)
                else:
                    processes.hand(run)

            dispatcher.direct = direct
        self.pipelines = PipelineRunner(owner=node.owner)
        self.supervisor = Supervisor(
            node, dispatcher=dispatcher, lease_ttl=lease_ttl, interval=activity_interval
        )
        self.poller = CommandPoller(node, lease=command_lease, interval=command_poll_interval)
        self.beacon = NodeBeacon(node, buckets=buckets, num_buckets=num_buckets, ttl=lease_ttl)
        self.beacon.commands_waiting = self.poller.wake
        self.scheduler = ScheduleRunner(
            node, rng=rng, submit=fire, accepting=self.accepting, owns=owns, follow=follow
        )
        self.reconciling = (
            None
            if reconcile_interval is None
            else ReconcileLoop(node, reconciler, interval=reconcile_interval, rng=rng)
        )
        self.retention = (
            None if not retention else RetentionLoop(node, retention, buckets=reconciler.buckets)
        )
        self._watched(node)
        if polling:  # the fleet sees the node from its first second
            self.start(*(self._fleet() if buckets is not None else self._declared()))

    def _watched(self, node: NodeContext) -> None:
        """Every service reports to the node's health: a thread that dies (started
        again, and said at CRITICAL), a pass that fails on a store fault (one line an
        episode, not one a pass)."""
        health = node.health
        loops: list[tuple[LoopService | None, str]] = [
            (self.supervisor, "supervisor"),
            (self.poller, "commands"),
            (self.beacon, "beacon"),
            (self.scheduler, "schedules"),
            (self.reconciling, "reconcile"),
            (self.retention, "retention"),
        ]
        for loop, label in loops:
            if loop is not None:
                loop.service = label
                loop.thread_watch = health.watch
                loop.faults = health.faults
        self.workers.thread_watch = health.watch
        self.aio.thread_watch = health.watch
        self.aio.on_stall = health.loop_stalled
        self.processes.thread_watch = health.watch
        health.processes = self.processes.counts
        self.pipelines.thread_watch = health.watch
        if self.writer is not None:
            self.writer.thread_watch = health.watch

    def _backlog(self) -> bool:
        """Runs waiting for a worker or on the event loop: a write queued behind then
        rides with theirs rather than commit alone."""
        return self._dispatcher.backlog() or self.aio.backlog()

    def accepting(self) -> bool:
        """Whether the node takes work (every submit asks: a global, not an attribute)."""
        return self.state is _OPEN

    def refusal(self, owner: str) -> str:
        """Why a submit is refused once the node takes no work."""
        if self.state is NodeState.DRAINING:
            return (
                f"node {owner} is draining before it closes: it takes no new tasks while "
                "the ones it runs finish"
            )
        return f"controller {owner} is closed"

    def start(self, *services: Service) -> None:
        """Start each of ``services`` at most once, and never once closing has begun."""
        with self._lock:
            if self.state is NodeState.OPEN:
                self._started()
                for service in services:
                    service.start()

    def start_work(self) -> None:
        """After a stored task: the writer, the workers, the supervisor, and command
        polling (every submit passes here)."""
        if self._working:
            return
        self._working = True
        if not self.workers.started:
            if self.writer is not None:
                self.start(self.writer)
            self.start(self.workers, self.supervisor)
        if self.polling:
            self.start(*self._fleet())

    def _declared(self) -> list[Service]:
        """What every node runs from its construction: its declaration in the store
        (so ``nodes`` and ``doctor`` see it, and a restart replaces its predecessor's at
        once) and command polling."""
        return [self.poller, self.beacon]

    def _fleet(self) -> list[Service]:
        """What a node that takes part in the fleet runs (from its construction where it
        declares buckets, else from its first stored task): its declaration and command
        polling, and reconciling its own buckets."""
        services = self._declared()
        services += [s for s in (self.reconciling, self.retention) if s is not None]
        return services

    def begin_drain(self) -> bool:
        """Stop taking work, the work held going on; ``False`` if it had stopped already."""
        with self._lock:
            if self.state is not NodeState.OPEN:
                return False
            self.state = NodeState.DRAINING
            return True

    def draining(self) -> bool:
        """Whether something the node holds is running or ready to start: what a drain
        waits for. A task waiting for its time, or held by a pause, will not finish on
        its own: it is not waited for."""
        if self._backlog():
            return True
        return any(run.status not in states.PAUSE_HELD for run in self._registry.active())

    def begin_close(self) -> bool:
        """Stop taking work and stop the work held; ``False`` if closing had begun
        already (a close during a drain goes on to close)."""
        with self._lock:
            if self.state not in (NodeState.OPEN, NodeState.DRAINING):
                return False
            self.state = NodeState.CLOSING
            return True

    def stop(self, deadline: float, *, carriers_stuck: bool = False) -> None:
        """Stop every service, then join each until the monotonic ``deadline`` (each
        at least ``JOIN_FLOOR`` seconds, so a service that ends at once is seen to): the
        scheduler first (no new runs), the writer after the workers (it drains what
        they handed it). ``carriers_stuck``: a task never stopped, so its worker never
        ends: the workers are not waited for (the others are idle and end at once)."""
        services: list[Service] = [
            self.scheduler,
            self.workers,
            self.aio,  # after the workers (no more hand-overs), before the writer
            self.processes,  # as the loop
            *([] if self.writer is None else [self.writer]),
            self.supervisor,
            self.poller,
            self.pipelines,
            self.beacon,
            *[s for s in (self.reconciling, self.retention) if s is not None],
        ]
        for service in services:
            service.stop()
        for service in services:
            left = max(JOIN_FLOOR, deadline - time.monotonic())
            service.join(min(0.5, left) if carriers_stuck and service is self.workers else left)
        self.processes.close()

    def retire(self) -> None:
        """Take the node's schedules and its declaration out of the store: it is gone."""
        self.scheduler.retire()
        if self.beacon.started:
            self.beacon.retire()
        self.state = NodeState.CLOSED
