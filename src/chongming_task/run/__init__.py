"""One task's life: the handle ``submit`` returns (``TaskRun``), one attempt on a worker
thread, the run's writes to the store, and the token its function holds. The node drives
a run through the handle's node-side methods; nothing here knows the node's services."""

from __future__ import annotations

from .handle import TaskRun as TaskRun
from .token import CancellationToken as CancellationToken

__all__ = ["CancellationToken", "TaskRun"]
