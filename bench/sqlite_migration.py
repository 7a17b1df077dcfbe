"""What opening an older SQLite file costs once: the migration to the current schema.

    uv run python bench/sqlite_migration.py [--tasks 1000000] [--trail 4] [--schema 8|15]

Builds a file as a release of schema 8 made it (``tests/unit/data/sqlite_schema_8.sql``:
tasks without ``seq``, the trail keyed by task id), or of schema 15 (the trail keyed by
``seq``, the result in the middle of the row), holding ``--tasks`` finished tasks, each
with ``--trail`` trail rows, written with raw SQL in random-id order as the store wrote
them. Then times ``SqliteTaskStore(path)`` on it: the migration copies ``tasks`` (schemas
9 and 16) and, from schema 8, rebuilds ``transitions`` (schema 11) in one transaction,
and that first open is the whole cost. Beside it: a second open of the migrated file
(nothing to do), and the raw copy of the same rows into fresh tables with ``INSERT ...
SELECT`` (the floor of any rebuild).
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

_DATA = Path(__file__).parent.parent / "tests" / "unit" / "data"
_STATUSES = ("queued", "starting", "running", "succeeded")


def build(path: Path, tasks: int, trail: int, schema: int) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size = 1024")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript((_DATA / f"sqlite_schema_{schema}.sql").read_text())
    keyed = schema >= 11  # the trail keyed by seq * 2^24 + version, seq the insert order
    ids = random.Random(7)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    # The columns that release's tasks table had, in the codec's order (the option and
    # trace columns came with schemas 13 and 14; a row leaves them at their defaults).
    had = {row[1] for row in conn.execute("PRAGMA table_info(tasks)")}
    columns = [c for c in codec.TASK_COLUMNS[:19] if c in had]
    task_marks = ", ".join("?" * len(columns))
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
                key = ((i + 1) * 16777216 + version,) if keyed else ()
                trails.append((*key, task_id, version, before, now, at, None, "n:1"))
        with conn:
            conn.executemany(
                f"INSERT INTO tasks ({', '.join(columns)}) VALUES ({task_marks})",
                rows,
            )
            marks = f"?, {trail_marks}" if keyed else trail_marks
            conn.executemany(f"INSERT INTO transitions VALUES ({marks})", trails)
    conn.execute(f"PRAGMA user_version = {schema}")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def raw_copy(path: Path) -> float:
    """The same rows copied into fresh tables by INSERT ... SELECT, rolled back."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        began = time.perf_counter()
        conn.execute("CREATE TABLE tasks_copy AS SELECT rowid AS rid, * FROM tasks")
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
    parser.add_argument("--schema", type=int, choices=(8, 15), default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"v{args.schema}.db"
        build(path, args.tasks, args.trail, args.schema)
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
    print(
        f"schema-{args.schema} file: {args.tasks:,} tasks, {args.trail} trail rows each, "
        f"{size:,.0f} MiB"
    )
    print(f"first open (the migration):         {first:6.2f} s")
    print(f"second open (nothing to do):        {second:6.3f} s")
    print(f"raw INSERT ... SELECT of the rows:  {copy:6.2f} s (no keys, no indexes)")


if __name__ == "__main__":
    main()
