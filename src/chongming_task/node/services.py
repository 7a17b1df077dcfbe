"""What a node's services share: ``NodeContext`` (handed to each at construction, so a
service never holds the controller) and ``NodeState`` (the node's one lifecycle, which
``NodeServices`` moves through). The loops themselves are ``chongming_task.loops``."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from ..loops import LoopService as LoopService
from ..loops import Pass as Pass
from ..loops import Service as Service

if TYPE_CHECKING:
    from ..clock import Clock
    from ..health import HealthMonitor
    from ..stores.capabilities import Capabilities
    from .leaseclock import LeaseClock
    from .registry import RunRegistry

__all__ = ["LoopService", "NodeContext", "NodeState", "Pass", "Service"]


class NodeState(enum.Enum):
    """A controller's life: it takes work while ``OPEN``; ``DRAINING`` (a close with a
    drain), it takes no new work and lets what it holds finish; ``CLOSING``, it stops
    what it holds; it is done once ``CLOSED``. It never goes back."""

    OPEN = "open"
    DRAINING = "draining"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeContext:
    """What every service of one node shares, handed in at construction (a service never
    holds the controller)."""

    owner: str
    clock: Clock
    now: Callable[[], datetime]
    """The clock's reading in UTC (a naive reading is refused)."""
    registry: RunRegistry
    capabilities: Capabilities
    leases: LeaseClock
    """The time lease decisions use (the store's clock where it has one)."""
    health: HealthMonitor
    """Where the services report store faults and thread deaths."""
