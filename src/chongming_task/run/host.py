"""The node as a run sees it (``RunHost``; ``WritesHost``, its writes' part), where a
worker's writes go (``Handoff``), and what a run may belong to (``RunGroup``):
protocols, so a run never holds the node itself."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Protocol

from ..clock import Clock
from ..errors import ConcurrencyConflict
from ..model import TaskSnapshot, Transition
from ..stores.capabilities import Capabilities
from ..values import ValueRules

if TYPE_CHECKING:
    from .life import Run
    from .writes import RunWrites

__all__ = ["Handoff", "RunGroup", "RunHost", "Taken", "WritesHost"]

Taken = tuple[tuple[Transition, ...], TaskSnapshot]
"""What a holder of the write lock took: the transitions to write, in order, and the
snapshot they lead to."""


class Handoff(Protocol):
    """A thread that writes runs' writes behind their workers (``run.writers``)."""

    joins_start: bool
    """Whether a worker leaves a run's start queued to join its end (``watch``)."""

    def put(self, writes: RunWrites, taken: Taken) -> None:
        """Write ``taken``; the write lock is held and the writer lets go of it."""

    def watch(self, writes: RunWrites) -> None:
        """``writes`` has a start queued and its write lock free: write it if its worker
        does not take it soon."""


class WritesHost(Protocol):
    """The node, as a run's writes see it: its clock and name, its store's capabilities
    (resolved once, with fallbacks), the buffer's bound, where to hand writes over, and
    where to report trouble."""

    capabilities: Capabilities
    writethrough_buffer: int
    clock: Clock
    owner: str
    """The actor of the transitions the run makes itself."""

    @property
    def writer(self) -> Handoff | None:
        """Where a worker's writes go on a store with group commit (``None``: the
        worker writes them itself)."""

    def desynced(
        self,
        task_id: str,
        exc: ConcurrencyConflict,
        local: TaskSnapshot,
        stored: TaskSnapshot | None,
    ) -> None:
        """Another writer changed the task in the store: ``local`` is this process's
        view, ``stored`` the store's (``None``: it could not be read)."""

    def report_late(self, ended: TaskSnapshot) -> None:
        """A desynced run ended here: keep what it came to beside the task."""

    def behind(self, task_id: str) -> None: ...

    def write_failed(self, task_id: str, exc: BaseException) -> None:
        """A write of the task failed and was buffered (a store fault: reported as an
        episode, not a line each)."""


class RunHost(WritesHost, Protocol):
    """What a run needs from its node."""

    clock: Clock
    owner: str
    rng: random.Random
    value_rules: ValueRules

    def ended(self, run: Run) -> None: ...

    def requeue(self, run: Run, delay: float) -> None: ...

    def abandon(self, run: Run) -> None: ...

    def cancel_async(self, run: Run, *, after: float) -> None:
        """Cancel an async run's attempt ``after`` seconds unless it has ended."""

    def terminate(self, run: Run) -> bool:
        """End the worker process carrying a process run (its stop or timeout grace ran
        out); whether one was carrying it."""

    def suspend(self, run: Run) -> int | None:
        """Stop the worker process carrying a process run where it stands (SIGSTOP);
        its pid, or ``None`` if none carries it."""

    def carry_on(self, run: Run) -> None:
        """Continue a suspended process run's worker process (SIGCONT)."""


class RunGroup(Protocol):
    """What a run may belong to (a pipeline run): told when a member has ended."""

    def node_finished(self, run: Run) -> None: ...
