"""``chongming_task.token``: where ``CancellationToken`` was first imported from; it lives
in ``chongming_task.run``."""

from __future__ import annotations

from .run.token import CancellationToken as CancellationToken

__all__ = ["CancellationToken"]
