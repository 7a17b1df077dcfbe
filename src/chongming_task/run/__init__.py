"""One task's life: the node's ``Run`` (one attempt on a worker thread, the run's writes
to the store, the signals its token hears), the handle ``submit`` returns (``TaskRun``),
and the token its function holds. Nothing here knows the node's services."""

from __future__ import annotations

from .handle import TaskRun as TaskRun
from .token import CancellationToken as CancellationToken

__all__ = ["CancellationToken", "TaskRun"]
