"""``PostgresTaskStore``: the store, its named SQL (``queries.sql``, ``schema.sql``), its
group commit, its ``LISTEN``/``NOTIFY`` loop and how the driver's errors are worded.

Importing this package needs no driver; constructing the store without one raises a
``StoreError`` that names the install command."""

from __future__ import annotations

from .store import DEFAULT_SCHEMA as DEFAULT_SCHEMA
from .store import INSTALL_HINT as INSTALL_HINT
from .store import SCHEMA_VERSION as SCHEMA_VERSION
from .store import PostgresTaskStore as PostgresTaskStore

__all__ = ["DEFAULT_SCHEMA", "INSTALL_HINT", "SCHEMA_VERSION", "PostgresTaskStore"]
