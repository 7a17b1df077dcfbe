"""The SQLite store's schema: opening a file (its pragmas, WAL, the version check),
creating or upgrading its tables from the ``schema_`` blocks of ``schema.sql``, and the
one upgrade that rebuilds the trail. Opening a current file writes nothing."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

from ...errors import StoreError
from .. import codec
from ..sql import load_named, newer_schema
from .connection import SqliteConnection

__all__ = [
    "AUTOCHECKPOINT",
    "PAGE_SIZE",
    "SCHEMA_VERSION",
    "migrate",
    "open_schema",
    "pragma_value",
]

SCHEMA_VERSION = 16  # 2: nodes, node_buckets; 3: schedules; 4: pipelines; 5: finished
# index; 6: owner index, owner fixed at create; 7: a new task's row carries its first
# transition (task_writes_new); 8: a compare-and-set's row carries its last one
# (task_writes_life); 9: tasks.seq, the trail keyed by it (_rebuild_trail); 10: the
# trail of tasks not held in loose_transitions; 11: the trail keyed by rowid, seq * 2^24 +
# version (_rebuild_trail); 12: nodes.health, late_reports, idx_commands_pending; 13: the
# option columns (run_at, priority, dedupe_key, dedupe_window, concurrency_key); 14:
# tasks.trace_context; 15: holds; 16: tasks.outcome last, after tasks.outcome_preview
# (_result_last)
PAGE_SIZE = 1024  # for new files; see open_schema
AUTOCHECKPOINT = 8192
"""Pages in the WAL past which a commit checkpoints, where commits do (without the
Checkpointer's thread): task rows are rewritten several times in their first second, so
a hot page is copied back once, not once per transition."""

log = logging.getLogger("chongming_task.store")

_SQL = load_named(__package__, "schema.sql")
_ADDED_COLUMNS = {  # to tasks, by schemas 13 and 14
    "run_at": "TEXT",
    "priority": "INTEGER NOT NULL DEFAULT 0",
    "dedupe_key": "TEXT",
    "dedupe_window": "REAL",
    "concurrency_key": "TEXT",
    "trace_context": "TEXT",
}
_SCHEMA = [sql for name, sql in _SQL.items() if name.startswith("schema_")]


def open_schema(
    link: SqliteConnection,
    *,
    memory: bool,
    create: bool,
    timeout: float,
    upgrade: bool,
    synchronous: str = "NORMAL",
) -> None:
    """Configure the connection; create or upgrade the schema only when it is not
    current. Opening a current file writes nothing and takes no lock, so a reader
    (``ps``, ``show``) opens and reads under WAL while another process holds the write
    lock, and never rewrites the header of a file it only reads."""
    conn = link.conn
    conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    # Per connection, nothing written. In WAL mode NORMAL survives process crashes (an
    # OS crash or power loss may drop the last commits); FULL syncs the WAL at each
    # commit and survives those too (``SqliteTaskStore``'s ``durability``).
    if synchronous not in ("NORMAL", "FULL"):
        raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    # No automatic checkpoints: the Checkpointer's thread makes them (a commit that
    # took the WAL past the threshold made its caller wait for ~8,000 pages copied).
    conn.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT if memory else 0}")
    conn.execute(f"PRAGMA journal_size_limit = {64 * 1024 * 1024}")
    if _schema_is_current(link):
        return
    if not create and not memory and not _has_tables(link):
        raise StoreError(
            f"{link.path} is not a chongming-task database (it has no tasks table"
            f"{'; the file is empty' if Path(link.path).stat().st_size == 0 else ''}): "
            "check --db, or create it with `chongming-task --db PATH migrate`"
        )
    if not upgrade and not memory and _has_tables(link):
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        raise StoreError(
            f"{link.path} has schema {version}, older than this chongming-task's "
            f"({SCHEMA_VERSION}); it is not upgraded here, as nodes of the older release "
            "could not use it after: upgrade the nodes, or stop them and run "
            f"`chongming-task --db {link.path} migrate`"
        )
    # A new file gets small pages: every commit copies each page it dirtied into the
    # WAL, and a task's write dirties a few pages (its row, the status index, its
    # trail) to change a few hundred bytes. No effect on an existing file.
    conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    if not memory:
        _use_wal(link, timeout)
    migrate(link)


def _use_wal(link: SqliteConnection, timeout: float) -> None:
    """Switch the file to WAL, trying again for up to ``timeout`` while another
    process holds it. Nodes started together on a new file each switch it, and
    while one's switch (or any write in the rollback journal) holds the write lock,
    SQLite answers the others "database is locked" at once, without the busy
    handler: a switch holds a read lock, and waiting on a writer with it could
    deadlock. So an open failed where ``timeout`` promised a wait."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            (mode,) = link.conn.execute("PRAGMA journal_mode = WAL").fetchone()
            break
        except sqlite3.OperationalError as exc:
            busy = exc.sqlite_errorcode == sqlite3.SQLITE_BUSY
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    if mode != "wal":
        raise StoreError(
            f"SQLite kept {link.path} in journal mode {mode!r}: this store needs WAL "
            "(readers beside a writer); WAL needs the processes to share memory, which "
            "a network file system cannot give"
        )


def _schema_is_current(link: SqliteConnection) -> bool:
    """Whether the schema is this version's, to the last object (a read, no lock)."""
    (version,) = link.conn.execute("PRAGMA user_version").fetchone()
    if version > SCHEMA_VERSION:
        raise newer_schema(str(link.path), version, SCHEMA_VERSION)
    if version < SCHEMA_VERSION:
        return False
    (found,) = link.conn.execute(
        "SELECT COUNT(*) FROM sqlite_master "
        "WHERE name IN ('task_writes_trail', 'node_buckets', 'schedules', 'pipelines', "
        "'idx_commands_finished', 'idx_commands_pending', 'idx_tasks_owner', "
        "'loose_transitions', 'late_reports', 'holds')"
    ).fetchone()
    mode = link.conn.execute("PRAGMA journal_mode").fetchone()[0]
    return found == 10 and (link.path == ":memory:" or mode == "wal")


def _has_tables(link: SqliteConnection) -> bool:
    (found,) = link.conn.execute(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'tasks'"
    ).fetchone()
    return bool(found)


def migrate(link: SqliteConnection) -> None:
    """Create the schema, or upgrade an older one, in one transaction."""
    conn = link.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise newer_schema(str(link.path), version, SCHEMA_VERSION)
        trail = _columns(conn, "transitions")
        old_trail = bool(trail) and trail[0] != "key"  # a file made before schema 11
        every = _columns(conn, "tasks", hidden=True)
        result_inside = bool(every) and every[-1] != "outcome"  # made before schema 16
        if old_trail or result_inside:  # each a copy of the tasks: said once, with the count
            (tasks,) = conn.execute("SELECT COUNT(*) FROM tasks").fetchone()
            log.warning(
                "%s: upgrading to schema %d, which copies its %d tasks%s once (about %d s "
                "a million tasks); other processes wait for the file",
                link.path,
                SCHEMA_VERSION,
                tasks,
                " and their trail" if old_trail else "",
                40 if old_trail else 20,
            )
        if old_trail:
            _rebuild_trail(conn)
        have = _columns(conn, "tasks")
        for column, kind in _ADDED_COLUMNS.items():  # a file made before schema 13 or 14
            if have and column not in have:
                conn.execute(f"ALTER TABLE tasks ADD COLUMN {column} {kind}")
        every = _columns(conn, "tasks", hidden=True)
        if every and every[-1] != "outcome":  # a file made before schema 16
            _result_last(conn)
        for statement in _SCHEMA:
            conn.execute(statement)
        if "health" not in _columns(conn, "nodes"):  # a file made before schema 12
            conn.execute("ALTER TABLE nodes ADD COLUMN health TEXT")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _columns(conn: sqlite3.Connection, table: str, *, hidden: bool = False) -> list[str]:
    """``table``'s columns in order (``hidden``: its generated ones too)."""
    pragma = "table_xinfo" if hidden else "table_info"
    return [row[1] for row in conn.execute(f"PRAGMA {pragma}({table})")]


def pragma_value(conn: sqlite3.Connection, name: str) -> str:
    """A pragma's value as it is set again (secure_delete reads 2 for FAST, and a 2 set
    would turn it on)."""
    (value,) = conn.execute(f"PRAGMA {name}").fetchone()
    return "FAST" if name == "secure_delete" and value == 2 else str(value)


def _rebuild_trail(conn: sqlite3.Connection) -> None:
    """Schemas 9 and 11, in the migration's transaction, for a file made before schema
    11. Before schema 9 tasks get ``seq`` (each task keeps its rowid, so the order tasks
    were made in): the table is made again, as SQLite adds no primary key to a table.
    The trail is copied into the rowid table schema 11 keys by ``seq * 16777216 +
    version``, each row under the seq its task has now (found by ``task_id``), in key
    order; a row whose task is not held goes to ``loose_transitions`` (before schema 10
    such rows waited in the trail under seq 0), which is made again with the trail's
    CHECK on versions. The view's triggers are dropped first (they name the old
    columns); the schema makes them again, with the indexes."""
    for trigger in ("task_writes_new", "task_writes_life", "task_writes_trail"):
        conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    # For the copy alone: a page cache that holds the tables, and the old pages freed
    # without zeroing them first (they hold what the new tables hold; Debian's SQLite
    # zeroes every freed page, which wrote the old tables out once more).
    restore = [
        f"PRAGMA {name} = {pragma_value(conn, name)}" for name in ("cache_size", "secure_delete")
    ]
    conn.execute("PRAGMA cache_size = -524288")  # 512 MiB
    conn.execute("PRAGMA secure_delete = FAST")
    if _columns(conn, "tasks")[:1] != ["seq"]:  # before schema 9
        task_columns = ", ".join(c for c in codec.TASK_COLUMNS if c not in _ADDED_COLUMNS)
        _make_as(conn, "tasks", "tasks_9")
        conn.execute(
            f"INSERT INTO tasks_9 (seq, {task_columns}) "
            f"SELECT rowid, {task_columns} FROM tasks ORDER BY rowid"
        )
        conn.execute("DROP TABLE tasks")
        conn.execute("ALTER TABLE tasks_9 RENAME TO tasks")
    trail_columns = ", ".join(codec.TRANSITION_COLUMNS)
    trail_values = ", ".join(f"r.{c}" for c in codec.TRANSITION_COLUMNS)
    # The loose trail gains the trail's CHECK on versions (schema 11): made again too.
    _make_as(conn, "loose_transitions", "loose_11")
    if _columns(conn, "loose_transitions"):  # schema 10
        conn.execute(f"INSERT INTO loose_11 SELECT {trail_columns} FROM loose_transitions")
        conn.execute("DROP TABLE loose_transitions")
    conn.execute("ALTER TABLE loose_11 RENAME TO loose_transitions")
    _make_as(conn, "transitions", "trail_11")
    # In key order, so each row lands at the right edge (in any other order, rows split
    # pages anywhere in the new tree).
    conn.execute(
        f"INSERT INTO trail_11 (key, {trail_columns}) "
        f"SELECT t.seq * 16777216 + r.version, {trail_values} "
        "FROM transitions r JOIN tasks t ON t.task_id = r.task_id "
        "WHERE 1 ORDER BY 1 ON CONFLICT DO NOTHING"
    )
    conn.execute(
        f"INSERT INTO loose_transitions ({trail_columns}) SELECT {trail_values} "
        "FROM transitions r WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.task_id = r.task_id) "
        "ON CONFLICT DO NOTHING"
    )
    conn.execute("DROP TABLE transitions")
    conn.execute("ALTER TABLE trail_11 RENAME TO transitions")
    for pragma in restore:
        conn.execute(pragma)


def _result_last(conn: sqlite3.Connection) -> None:
    """Schema 16, in the migration's transaction: ``tasks`` made again with ``outcome``
    its last column and ``outcome_preview`` (generated) before it, every row copied in
    ``seq`` order (a row keeps its seq: the trail is keyed by it). The view's triggers
    are dropped first (they name the table); the schema makes them again, with the
    indexes."""
    for trigger in ("task_writes_new", "task_writes_life", "task_writes_trail"):
        conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    columns = ", ".join(("seq", *codec.TASK_COLUMNS))
    _make_as(conn, "tasks", "tasks_16")
    conn.execute(f"INSERT INTO tasks_16 ({columns}) SELECT {columns} FROM tasks ORDER BY seq")
    conn.execute("DROP TABLE tasks")
    conn.execute("ALTER TABLE tasks_16 RENAME TO tasks")


def _make_as(conn: sqlite3.Connection, table: str, name: str) -> None:
    """Make ``table`` as the schema makes it (its ``schema_`` block), named ``name``."""
    made = _SQL[f"schema_{table}"]
    conn.execute(made.replace(f"IF NOT EXISTS {table} (", f"{name} (", 1))
