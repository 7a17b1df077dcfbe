"""``SqliteTaskStore``: the store, its named SQL (``schema.sql``, ``queries.sql``), its
group commit, its transaction scopes and the thread that copies the WAL back into the
file."""

from __future__ import annotations

from .store import PAGE_SIZE as PAGE_SIZE
from .store import SCHEMA_VERSION as SCHEMA_VERSION
from .store import SqliteTaskStore as SqliteTaskStore

__all__ = ["PAGE_SIZE", "SCHEMA_VERSION", "SqliteTaskStore"]
