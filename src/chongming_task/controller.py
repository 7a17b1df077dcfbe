"""``chongming_task.controller``: where ``Controller`` was first imported from; it lives
in ``chongming_task.node``."""

from __future__ import annotations

from .node.controller import Controller as Controller
from .node.controller import ReconcileReport as ReconcileReport

__all__ = ["Controller", "ReconcileReport"]
