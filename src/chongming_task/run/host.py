"""The node as a run's writes see it (``WritesHost``), and where a worker's writes go
(``Handoff``): protocols, so a run never holds the node itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..clock import Clock
from ..errors import ConcurrencyConflict
from ..model import TaskSnapshot, Transition
from ..stores.capabilities import Capabilities

if TYPE_CHECKING:
    from .writes import RunWrites

__all__ = ["Handoff", "Taken", "WritesHost"]

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
