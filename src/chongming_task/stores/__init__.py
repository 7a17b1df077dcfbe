"""Built-in stores and the ``TaskStore`` contract.

``PostgresTaskStore`` lives in ``chongming_task.stores.postgres`` and is imported only when
asked for, so this package needs no third-party driver.
"""

from __future__ import annotations

from pathlib import Path

from .memory import InMemoryTaskStore as InMemoryTaskStore
from .protocol import TaskStore as TaskStore
from .sqlite import SqliteTaskStore as SqliteTaskStore

__all__ = ["InMemoryTaskStore", "SqliteTaskStore", "TaskStore", "open_store"]

DEFAULT_DATABASE = "chongming-task.db"


def open_store(target: str | Path = DEFAULT_DATABASE, *, create: bool = True) -> TaskStore:
    """Open the store a ``--db`` value names: a SQLite path (or ``:memory:``)."""
    return SqliteTaskStore(target, create=create)
