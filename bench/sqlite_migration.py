"""What opening an older SQLite file costs once: the migration to the current schema.

    uv run python bench/sqlite_migration.py [--tasks 1000000] [--trail 4]

Builds a file as a release of schema 8 made it (``tests/unit/data/sqlite_schema_8.sql``:
tasks without ``seq``, the trail keyed by task id) holding ``--tasks`` finished tasks,
each with ``--trail`` trail rows, written with raw SQL in random-id order as the store
wrote them. Then times ``SqliteTaskStore(path)`` on it: the migration rebuilds ``tasks``
and ``transitions`` (schemas 9 and 11) in one transaction, and that first open is the whole
cost. Beside it: a second open of the migrated file (nothing to do), and the raw copy of
the same rows into fresh tables with ``INSERT ... SELECT`` (the floor of any rebuild).
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chongming_task import SqliteTaskStore
from chongming_task.stores import codec

_SCHEMA_8 = Path(__file__).parent.parent / "tests" / "unit" / "data" / "sqlite_schema_8.sql"
_STATUSES = ("queued", "starting", "running", "succeeded")


def build(path: Path, tasks: int, trail: int) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size = 1024")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(_SCHEMA_8.read_text())
    ids = random.Random(7)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    task_marks = ", ".join("?" * len(codec.TASK_COLUMNS))
    trail_marks = ", ".join("?" * len(codec.TRANSITION_COLUMNS))
    for offset in range(0, tasks, 10_000):
        rows, trails = [], []
        for i in range(offset, min(tasks, offset + 10_000)):
            task_id = f"{ids.getrandbits(128):032x}"
            at = codec.encode_dt(start + timedelta(milliseconds=i))
            identity = (task_id, "job", "succeeded", trail, 1, "[]", None, None, None, "n:1")
            rows.append((*identity, at, at, at, None, None, None, '"ok"', None, None))
            for version in range(1, trail + 1):
                before = _STATUSES[version - 2] if version > 1 else None
                now = _STATUSES[min(version - 1, len(_STATUSES) - 1)]
                trails.append((task_id, version, before, now, at, None, "n:1"))
        with conn:
            conn.executemany(
                f"INSERT INTO tasks ({', '.join(codec.TASK_COLUMNS)}) VALUES ({task_marks})",
                rows,
            )
            conn.executemany(f"INSERT INTO transitions VALUES ({trail_marks})", trails)
    conn.execute("PRAGMA user_version = 8")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def raw_copy(path: Path) -> float:
    """The same rows copied into fresh tables by INSERT ... SELECT, rolled back."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        began = time.perf_counter()
        conn.execute("CREATE TABLE tasks_copy AS SELECT rowid AS seq, * FROM tasks")
        conn.execute("CREATE TABLE trail_copy AS SELECT * FROM transitions")
        took = time.perf_counter() - began
        conn.execute("ROLLBACK")
        return took
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--trail", type=int, default=4, help="trail rows a task")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v8.db"
        build(path, args.tasks, args.trail)
        size = path.stat().st_size / 2**20
        copy = raw_copy(path)
        began = time.perf_counter()
        SqliteTaskStore(path).close()
        first = time.perf_counter() - began
        began = time.perf_counter()
        store = SqliteTaskStore(path)
        second = time.perf_counter() - began
        try:
            (version,) = store.connection.conn.execute("PRAGMA user_version").fetchone()
            assert store.counts() and version >= 9
            (rows,) = store.connection.conn.execute("SELECT COUNT(*) FROM transitions").fetchone()
            assert rows == args.tasks * args.trail, rows
        finally:
            store.close()
    print(f"schema-8 file: {args.tasks:,} tasks, {args.trail} trail rows each, {size:,.0f} MiB")
    print(f"first open (the migration):         {first:6.2f} s")
    print(f"second open (nothing to do):        {second:6.3f} s")
    print(f"raw INSERT ... SELECT of the rows:  {copy:6.2f} s (no keys, no indexes)")


if __name__ == "__main__":
    main()
