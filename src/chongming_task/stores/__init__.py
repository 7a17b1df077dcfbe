"""Built-in stores and the ``TaskStore`` contract (the roles beyond it:
``chongming_task.stores.roles``).

``PostgresTaskStore`` lives in ``chongming_task.stores.postgres`` and is imported only when
asked for, so this package needs no third-party driver.
"""

from __future__ import annotations

from pathlib import Path

from .dsn import check_target, is_postgres_dsn
from .memory import InMemoryTaskStore as InMemoryTaskStore
from .protocol import TaskStore as TaskStore
from .sqlite.store import DEFAULT_DURABILITY, Durability
from .sqlite.store import SqliteTaskStore as SqliteTaskStore

__all__ = ["InMemoryTaskStore", "SqliteTaskStore", "TaskStore", "is_postgres_dsn", "open_store"]

DEFAULT_DATABASE = "chongming-task.db"


def open_store(
    target: str | Path = DEFAULT_DATABASE,
    *,
    create: bool = True,
    schema: str | None = None,
    upgrade: bool = True,
    wait_for_server: bool = True,
    pooled: bool = False,
    listen_dsn: str | None = None,
    prepare: bool | None = None,
    durability: Durability = DEFAULT_DURABILITY,
    pool_size: int | None = None,
    application_name: str | None = None,
) -> TaskStore:
    """Open the store a ``--db`` value names: a ``postgresql://`` DSN, or a SQLite path
    (or ``:memory:``). ``create=False`` refuses to create a missing SQLite file;
    ``upgrade=False`` refuses a SQLite file of an older schema (``SqliteTaskStore``);
    ``wait_for_server=False`` makes a PostgreSQL server that nothing listens for an
    error at once; ``pooled`` and ``listen_dsn``: a DSN that reaches it through a pooler
    in transaction mode, and ``prepare`` whether statements are prepared
    (``PostgresTaskStore``), with ``pool_size`` its pool's most connections and
    ``application_name`` the name the server shows for them (each ``None``: the
    store's default); ``durability`` what a SQLite commit survives
    (``SqliteTaskStore``). A URL of any other scheme is a ``ConfigurationError``."""
    check_target(target)
    if is_postgres_dsn(target):
        from .postgres.store import DEFAULT_SCHEMA, PostgresTaskStore

        return PostgresTaskStore(
            str(target),
            schema=schema or DEFAULT_SCHEMA,
            wait_for_server=wait_for_server,
            pooled=pooled,
            listen_dsn=listen_dsn,
            prepare=prepare,
            max_size=3 if pool_size is None else pool_size,
            application_name=application_name or "chongming-task",
        )
    return SqliteTaskStore(target, create=create, upgrade=upgrade, durability=durability)
